export { StateStore } from './store.js';
export { RECORD_KIND, StepName, Phase, parseRecord, recordProblems, type PodRecord, type Step, type Op } from './record.js';
