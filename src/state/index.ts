export { StateStore } from './store.js';
export {
  RECORD_KIND,
  StepName,
  Phase,
  parseRecord,
  recordProblems,
  newRecord,
  type PodRecord,
  type Step,
  type Op,
} from './record.js';
export type { PodInterface } from './types.js';
