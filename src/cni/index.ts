// The CNI client: config loading, plugin exec, chaining, result cache, versions, errors.
export type { CniDns, CniErrorJson, CniInterface, CniIpConfig, CniResult, CniRoute } from './types.js';
export { CniErrorCode } from './types.js';
export {
  buildEnv,
  buildOneConfig,
  CniVerb,
  confFiles,
  CONF_EXTENSIONS,
  formatCniArgs,
  loadConfList,
  confListLoader,
  MAX_IFNAME_BYTES,
  parseConfList,
  runtimeConfigFor,
  validateCniArgs,
  validateContainerId,
  validateIfName,
  validateNetworkName,
  validateRuntime,
  type NetworkConfigList,
  type PluginConf,
  type RuntimeConf,
} from './config.js';
export {
  spawnPluginExec,
  findInPath,
  DEFAULT_PLUGIN_OUTPUT_BYTES,
  type SpawnPluginExecOptions,
  type PluginExec,
  type PluginRunOptions,
} from './exec.js';
export { killOrphanPlugins, readPgidRecords, type PgidRecord } from './pgid.js';
export {
  CniClient,
  parsePluginResult,
  STATUS_CANNOT_ADD,
  STATUS_DEGRADED,
  supportsCheck,
  supportsStatusAndGc,
  type CniClientOptions,
  type GcAttachment,
  type GcOptions,
  type GcReport,
  type PluginStatus,
} from './client.js';
export {
  CNI_VERSIONS,
  compareVersions,
  convertResult,
  CURRENT_CNI_VERSION,
  isCniVersion,
  normalizeResult,
  type CniVersion,
} from './result.js';
export {
  buildCacheRecord,
  CACHE_KIND,
  cacheFilePath,
  cachedAttachments,
  cachedRecordsOf,
  sweepCacheTemps,
  parseCacheRecord,
  readCacheRecord,
  type CacheRead,
  type CacheRecord,
} from './cache.js';
export {
  CniError,
  CniPluginError,
  formatCniError,
  parseCniErrorJson,
  pluginFailure,
  type PluginFailure,
} from './errors.js';
