// The CNI client: config loading, plugin exec, chaining, result cache, versions, errors.
export type { CniResult } from './types.js';
export {
  loadConfList,
  confListLoader,
  parseConfList,
  type NetworkConfigList,
  type RuntimeConf,
} from './config.js';
export {
  spawnPluginExec,
  type PluginExec,
} from './exec.js';
export { killOrphanPlugins, readPgidRecords } from './pgid.js';
export {
  CniClient,
  type ConfigHold,
  startHeld,
  supportsCheck,
  type GcAttachment,
  type GcOptions,
  type GcReport,
  type PluginStatus,
} from './client.js';
export { sweepCacheTemps } from './cache.js';
export { CniPluginError } from './errors.js';
