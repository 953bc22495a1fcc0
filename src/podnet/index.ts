export {
  PodNetwork,
  IP_NETNS_DIR,
  describeInterfaces,
  type PodNetworkOptions,
  type PodNetworkState,
} from './podnetwork.js';
export { resultForRecover } from './recover.js';
export {
  BRIDGE_IP,
  BRIDGE_PREFIX,
  DEFAULT_IFNAME,
  bridgeName,
  tapName,
  type Observed,
  type ObservedLink,
  type ObservedRoute,
  type ObservedAddr,
} from './types.js';
export {
  planContainerSide,
  buildCsn,
  randomLaaMac,
  dhcpFilterRules,
  netnsStep,
  rpFilterStep,
  podNetnsSteps,
  RP_FILTER_OFF,
  cniAddStep,
  loUpStep,
  observedBeforeFromCsn,
  vfSetupStep,
  vlanFromConf,
  SRIOV_DISABLED_HINT,
  type ContainerSidePlan,
  type ContainerSidePlanInput,
} from './plan.js';
export { completeResult, fixOffSubnetGateways, isIncomplete, nonKernelRoutes } from './result.js';
export { decodeObserved, OBSERVE_REQUESTS } from './observe.js';
export { NetExec, isAlreadyUndone, runIpLines, observeNetns } from './exec.js';
export { queueFds } from './fds.js';
export { ipRequest } from './iplines.js';
export {
  BINDING_CHECKS,
  CheckReason,
  bindingOf,
  checkBridgeBinding,
  checkLinks,
  checkPod,
  checkTcRedirectBinding,
  prevResultForCheck,
  redirectsTo,
  type BindingCheck,
  type CheckFailure,
  type PodCheck,
} from './check.js';
