/** Entry point of the `collimate` command (bin/collimate.js loads this through tsx). */
import { run } from './commands.js';

const argv = process.argv.slice(2);
const code = await run(argv);
// A stopped server exits even if a library left a handle open; other commands end naturally.
if (argv[0] === 'serve') process.exit(code);
process.exitCode = code;
