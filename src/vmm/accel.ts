import { existsSync, readFileSync } from 'node:fs';
import type { Accel } from './argv.js';

export interface AccelChoice {
  accel: Accel;
  reason: string;
}

/**
 * KVM only where it is real hardware virtualization (kvm_intel / kvm_amd). /dev/kvm alone is not
 * enough: on these machines it is kvm_pvm (nested PVM), under which a stock guest dies with an
 * emulation failure, so we must fall back to TCG. COLLIMATE_ACCEL=kvm|tcg overrides.
 */
export function detectAccel(env: NodeJS.ProcessEnv = process.env, host: { sysModule?: string; devKvm?: string } = {}): AccelChoice {
  const sysModule = host.sysModule ?? '/sys/module';
  const devKvm = host.devKvm ?? '/dev/kvm';
  const forced = env.COLLIMATE_ACCEL;
  if (forced === 'kvm' || forced === 'tcg') return { accel: forced, reason: `COLLIMATE_ACCEL=${forced}` };
  if (forced) throw new Error(`COLLIMATE_ACCEL must be "kvm" or "tcg", not ${JSON.stringify(forced)}`);
  if (!existsSync(devKvm)) return { accel: 'tcg', reason: 'no /dev/kvm' };
  // /sys/module lists loaded and built-in modules alike (here /proc/modules did not show kvm_pvm).
  const loaded = (name: string) => existsSync(`${sysModule}/${name}`);
  if (loaded('kvm_pvm')) return { accel: 'tcg', reason: '/dev/kvm is kvm_pvm (nested PVM), which cannot run a stock guest' };
  if (loaded('kvm_intel') || loaded('kvm_amd')) {
    return { accel: 'kvm', reason: 'hardware virtualization (kvm_intel/kvm_amd)' };
  }
  return { accel: 'tcg', reason: '/dev/kvm present but no kvm_intel/kvm_amd module' };
}

/**
 * Kernel arguments that keep a TCG guest's boot deterministic. Under TCG the guest TSC runs at the
 * host's TSC rate, but the guest cannot calibrate it: with no HPET or ACPI PM timer on microvm it
 * calibrates against the PIT, which fails when the host is loaded, and the boot then stalls for a
 * long time. Telling the kernel the rate (tsc_early_khz) skips that calibration. That TSC is the
 * host's constant one, so the kernel is also told it is reliable (`tsc=reliable`): without it the
 * clocksource watchdog wakes an idle guest twice a second to check it, a quarter of what an idle
 * sandbox costs the host (0.40 → 0.30 % of a core, bench/idle-cpu.ts).
 * With KVM the guest gets the rate from the hypervisor, so nothing is added.
 */
export function guestClockArgs(accel: Accel, cpuinfo = '/proc/cpuinfo'): string[] {
  if (accel !== 'tcg') return [];
  const mhz = hostTscMhz(cpuinfo);
  return mhz ? [`tsc_early_khz=${mhz * 1000}`, 'tsc=reliable'] : [];
}

/** The host TSC rate in whole MHz: the kernel's "cpu MHz" of a constant-TSC CPU, rounded so the
 * value (part of every artifact key) is stable from one start to the next. */
export function hostTscMhz(cpuinfo = '/proc/cpuinfo'): number | undefined {
  try {
    const text = readFileSync(cpuinfo, 'utf8');
    if (!/^flags\s*:.*\bconstant_tsc\b/m.test(text)) return undefined;
    const m = text.match(/^cpu MHz\s*:\s*([0-9.]+)/m);
    return m ? Math.round(Number(m[1])) : undefined;
  } catch {
    return undefined;
  }
}
