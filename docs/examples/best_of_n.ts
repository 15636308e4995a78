// RL SDK: best-of-N over live forks. Prepare a state once, fork it into 4 children, run a different
// candidate in each, keep the best by its output, and delete the rest. With `npm install @collimate/sdk`:
//   COLLIMATE_API_KEY=clm_… node --import tsx best_of_n.ts
// In this repository (docs/examples/tsconfig.json resolves @collimate/sdk to sdk/typescript):
//   COLLIMATE_API_KEY=clm_… TSX_TSCONFIG_PATH=docs/examples/tsconfig.json node --import tsx docs/examples/best_of_n.ts
import { bestOfN, connect } from '@collimate/sdk/rl';

const fleet = connect(); // every sandbox it creates or forks carries {collimate_run: fleet.runId}
try {
  const root = await fleet.create('base');
  await root.exec({ command: 'echo 100 > /root/bound' }); // the state every candidate inherits

  // Task: print the largest prime below the bound. Only one candidate gets it right.
  const candidates = [
    'echo 89',
    'echo 99',
    'n=$(($(cat /root/bound)-1)); while [ $n -gt 1 ]; do i=2; p=1; while [ $((i*i)) -le $n ]; do ' +
      'if [ $((n%i)) -eq 0 ]; then p=0; break; fi; i=$((i+1)); done; [ $p = 1 ] && { echo $n; exit 0; }; n=$((n-1)); done',
    'echo 91',
  ];
  const isPrime = (n: number) => n > 1 && Array.from({ length: Math.floor(Math.sqrt(n)) - 1 }, (_, i) => i + 2).every((d) => n % d !== 0);

  const { winner, all } = await bestOfN(
    root,
    candidates.length,
    (sb, i) => sb.exec({ command: candidates[i] }),
    (r) => (isPrime(Number(r.stdout)) ? Number(r.stdout) : -Infinity),
  );
  console.log('scores:', all.map((s) => s.score).join(' '));
  console.log(`winner: candidate ${winner.index} printed ${winner.result.stdout.trim()}`);
  await root.delete();
} finally {
  // Whatever happened above, nothing of this run is left behind.
  console.log('swept:', await fleet.sweep());
}
