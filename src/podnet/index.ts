export {
  PodNetwork,
  describeInterfaces,
  type PodNetworkState,
} from './podnetwork.js';
export { queueFds } from './fds.js';
export { bindingOf, type PodCheck } from './check.js';
