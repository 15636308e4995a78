/** The CLI reads exec streams with the SDK's SSE parser (see sdk/typescript/src/transport.ts). */
export { parseSse, type SseEvent } from '../../sdk/typescript/src/transport.js';
