import { existsSync } from 'node:fs';
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
