// A pod's health as tapmanager can tell it without changing anything (tapctl check, --check-interval): its own checks
// (the netns, each interface's binding, where the VM's MAC is, the DHCP server) and CNI CHECK with a prevResult that
// says what the pod netns holds now. Nothing here repairs: a failure is reported with its reason, and
// docs/operations.md says what an operator does for each. prevResultForCheck and the bridge binding's check are pure.
import { existsSync } from 'node:fs';
import { errorChain } from '../errors.js';
import {
  supportsCheck,
  type CniClient,
  type CniResult,
  type NetworkConfigList,
  type RuntimeConf,
} from '../cni/index.js';
import type { PodInterface } from '../state/types.js';
import { observeNetns, type NetExec } from './exec.js';
import { hasSandbox } from './result.js';
import type { Observed, ObservedLink } from './types.js';

/** Why a check failed: the label of vmpod_pod_check_failures_total, one section each in docs/operations.md. */
export const CheckReason = {
  NetnsMissing: 'netns-missing',
  LinkMissing: 'link-missing',
  LinkDown: 'link-down',
  LinkUnbridged: 'link-unbridged',
  /** a tc-redirect interface or its tap lost the filter that redirects its frames to the other */
  RedirectMissing: 'redirect-missing',
  MacMisplaced: 'mac-misplaced',
  DhcpNotListening: 'dhcp-not-listening',
  CniCheckFailed: 'cni-check-failed',
  /** the check itself could not run (the pod's netns unreadable, its CNI config unparsable) */
  CheckError: 'check-error',
} as const;
export type CheckReason = (typeof CheckReason)[keyof typeof CheckReason];

export interface CheckFailure {
  reason: CheckReason;
  detail: string;
}

/** What a check found: `cni` says whether CNI CHECK ran (a list below 0.4.0, or with disableCheck, is not checked). */
export interface PodCheck {
  key: string;
  ok: boolean;
  failures: CheckFailure[];
  cni: 'checked' | 'disabled' | 'unsupported' | 'not-run';
  at: string;
}

/**
 * The prevResult CNI CHECK gets: the cached ADD result as the pod netns holds it now. Every interface tapmanager
 * bound gave its addresses to the VM, and the routes with them (CNI routes carry no interface: they are the first
 * one's, as Virtlet assumes); one whose MAC went to the VM (the bridge binding, a VF) is named without a MAC. What
 * the plugins still own stays as it was: the host-side interfaces with their MACs, the DNS, and the IPAM
 * allocation (which host-local checks in its own store, not in prevResult).
 */
export function prevResultForCheck(cached: CniResult, interfaces: readonly PodInterface[]): CniResult {
  const bound = new Set(interfaces.map((i) => i.index));
  const macGone = new Set(interfaces.filter((i) => i.type === 'vf' || macMoved(i)).map((i) => i.index));
  const first = cached.interfaces.findIndex(hasSandbox);
  const moved = (idx: number | undefined): boolean => bound.has(idx ?? first) || (idx === undefined && first < 0);
  return {
    cniVersion: cached.cniVersion,
    interfaces: cached.interfaces.map((ci, idx) => {
      if (!macGone.has(idx)) return { ...ci };
      const { mac: _mac, ...rest } = ci;
      return rest;
    }),
    ips: cached.ips.filter((ip) => !moved(ip.interface)).map((ip) => ({ ...ip })),
    routes: bound.size > 0 ? [] : cached.routes.map((r) => ({ ...r })),
    dns: { ...cached.dns },
  };
}

/**
 * The plan gave the CNI interface a new MAC and its own to the VM (the bridge binding; a binding that shares the MAC
 * does not).
 */
function macMoved(i: PodInterface): boolean {
  return i.type === 'tap' && i.vethMacNew !== undefined && i.vethMacNew.toLowerCase() !== i.vmMac.toLowerCase();
}

/** What a binding check sees: the pod netns as observed now, and a way to ask it more (tc filters). */
export interface BindingCheckContext {
  observed: Observed;
  nsPath: string;
  exec?: Pick<NetExec, 'inNetns'>;
}

/** What one binding's interface must look like in the pod netns. A new binding adds its entry to BINDING_CHECKS. */
export type BindingCheck = (iface: PodInterface, ctx: BindingCheckContext) => CheckFailure[] | Promise<CheckFailure[]>;

/** Each named link exists and is up. */
function linksUp(observed: Observed, links: readonly (readonly [name: string, what: string])[]): CheckFailure[] {
  const out: CheckFailure[] = [];
  for (const [name, what] of links) {
    const link = observed.links.find((l) => l.name === name);
    if (!link) out.push({ reason: CheckReason.LinkMissing, detail: `the ${what} ${name} is gone from the pod netns` });
    else if (!link.up) out.push({ reason: CheckReason.LinkDown, detail: `the ${what} ${name} is down` });
  }
  return out;
}

/**
 * The bridge binding: the CNI interface and the tap are up ports of the bridge; the CNI interface has the MAC the plan
 * gave it.
 */
export function checkBridgeBinding(iface: PodInterface, ctx: { observed: Observed }): CheckFailure[] {
  const out: CheckFailure[] = [];
  const find = (name: string): ObservedLink | undefined => ctx.observed.links.find((l) => l.name === name);
  const veth = find(iface.cniName);
  const bridge = find(iface.bridgeName);
  const tap = find(iface.tapName);
  out.push(
    ...linksUp(ctx.observed, [
      [iface.cniName, 'CNI interface'],
      [iface.bridgeName, 'bridge'],
      [iface.tapName, 'tap'],
    ]),
  );
  for (const link of [veth, tap]) {
    if (link && bridge && link.master !== iface.bridgeName) {
      out.push({
        reason: CheckReason.LinkUnbridged,
        detail: `${link.name} is not a port of ${iface.bridgeName} (its master: ${link.master ?? 'none'})`,
      });
    }
  }
  if (veth && iface.vethMacNew !== undefined && veth.mac.toLowerCase() !== iface.vethMacNew.toLowerCase()) {
    out.push({
      reason: CheckReason.MacMisplaced,
      detail: `${iface.cniName} has MAC ${veth.mac}, the plan gave it ${iface.vethMacNew}`,
    });
  }
  return out;
}

/**
 * The tc-redirect binding: the CNI interface (with the VM's MAC, which it shares) and the tap are up, and each has its
 * ingress filter redirecting every frame to the other (tcredirect.ts), as `tc -j filter show` lists them.
 */
export async function checkTcRedirectBinding(iface: PodInterface, ctx: BindingCheckContext): Promise<CheckFailure[]> {
  const out = linksUp(ctx.observed, [
    [iface.cniName, 'CNI interface'],
    [iface.tapName, 'tap'],
  ]);
  const cni = ctx.observed.links.find((l) => l.name === iface.cniName);
  if (cni && cni.mac.toLowerCase() !== iface.vmMac.toLowerCase()) {
    out.push({
      reason: CheckReason.MacMisplaced,
      detail: `${iface.cniName} has MAC ${cni.mac}, not the ${iface.vmMac} it shares with the VM`,
    });
  }
  if (!ctx.exec || out.some((f) => f.reason === CheckReason.LinkMissing)) return out;
  for (const [dev, to] of [
    [iface.cniName, iface.tapName],
    [iface.tapName, iface.cniName],
  ] as const) {
    const r = await ctx.exec.inNetns(ctx.nsPath, ['tc', '-j', 'filter', 'show', 'dev', dev, 'ingress']);
    if (r.exitCode !== 0 || !redirectsTo(r.stdout, to)) {
      out.push({
        reason: CheckReason.RedirectMissing,
        detail:
          `${dev} has no ingress filter redirecting its frames to ` +
          `${to}${r.exitCode !== 0 ? ` (tc: ${r.stderr.trim()})` : ''}`,
      });
    }
  }
  return out;
}

/** Pure: does `tc -j filter show` output hold a mirred redirect to `to`? */
export function redirectsTo(tcJson: string, to: string): boolean {
  let filters: unknown;
  try {
    filters = JSON.parse(tcJson === '' ? '[]' : tcJson);
  } catch {
    return false;
  }
  if (!Array.isArray(filters)) return false;
  return filters.some((f) => {
    const actions = (f as { options?: { actions?: unknown } }).options?.actions;
    return (
      Array.isArray(actions) &&
      actions.some(
        (a) =>
          (a as Record<string, unknown>).kind === 'mirred' &&
          (a as Record<string, unknown>).mirred_action === 'redirect' &&
          (a as Record<string, unknown>).to_dev === to,
      )
    );
  });
}

/** The binding of a pod interface: a VF, or its tap's binding (records before tc-redirect: bridge). */
export function bindingOf(i: PodInterface): 'vf' | 'bridge' | 'tc-redirect' {
  return i.type === 'vf' ? 'vf' : (i.binding ?? 'bridge');
}

/** Per binding. A VF left the pod netns for vfio-pci: nothing of it is there to check. */
export const BINDING_CHECKS: Record<ReturnType<typeof bindingOf>, BindingCheck> = {
  bridge: checkBridgeBinding,
  'tc-redirect': checkTcRedirectBinding,
  vf: () => [],
};

/** Every interface's binding, and the VM's MACs: on no link of the pod netns (the VM's NIC holds them). */
export async function checkLinks(
  interfaces: readonly PodInterface[],
  ctx: BindingCheckContext,
): Promise<CheckFailure[]> {
  const out: CheckFailure[] = [];
  const { observed } = ctx;
  for (const iface of interfaces) {
    out.push(...(await BINDING_CHECKS[bindingOf(iface)](iface, ctx)));
    const holder = observed.links.find((l) => l.mac.toLowerCase() === iface.vmMac.toLowerCase());
    if (holder && macMoved(iface)) {
      out.push({
        reason: CheckReason.MacMisplaced,
        detail: `the VM's MAC ${iface.vmMac} is on ${holder.name} in the pod netns, not only on the VM's NIC`,
      });
    }
  }
  return out;
}

export interface PodCheckInput {
  key: string;
  nsPath: string;
  interfaces: readonly PodInterface[];
  cni: CniClient;
  /** the network(s) the pod's ADD ran with */
  networks: () => Promise<NetworkConfigList[]>;
  runtime: RuntimeConf;
  /** undefined when the pod's DHCP servers listen, else why not */
  dhcp: () => string | undefined;
  /** runs tc in the pod netns (the tc-redirect binding's filters) */
  exec?: Pick<NetExec, 'inNetns'>;
}

/** Runs every check of one pod; never throws (a check that cannot run is a check-error failure). */
export async function checkPod(p: PodCheckInput): Promise<PodCheck> {
  const failures: CheckFailure[] = [];
  const done = (cni: PodCheck['cni']): PodCheck => ({
    key: p.key,
    ok: failures.length === 0,
    failures,
    cni,
    at: new Date().toISOString(),
  });
  if (!existsSync(p.nsPath)) {
    failures.push({ reason: CheckReason.NetnsMissing, detail: `the pod netns ${p.nsPath} is gone` });
    return done('not-run');
  }
  try {
    failures.push(
      ...(await checkLinks(p.interfaces, {
        observed: await observeNetns(p.nsPath),
        nsPath: p.nsPath,
        ...(p.exec ? { exec: p.exec } : {}),
      })),
    );
  } catch (e) {
    failures.push({ reason: CheckReason.CheckError, detail: `reading the pod netns: ${errorChain(e)}` });
  }
  const dhcp = p.dhcp();
  if (dhcp !== undefined) failures.push({ reason: CheckReason.DhcpNotListening, detail: dhcp });
  let cni: PodCheck['cni'] = 'unsupported';
  try {
    for (const list of await p.networks()) {
      if (!supportsCheck(list)) continue;
      const r = await p.cni.check(list, p.runtime, {
        prevResult: (cached) => prevResultForCheck(cached, p.interfaces),
      });
      if (r === 'checked' || cni === 'unsupported') cni = r;
    }
  } catch (e) {
    cni = 'checked';
    failures.push({ reason: CheckReason.CniCheckFailed, detail: errorChain(e) });
  }
  return done(cni);
}
