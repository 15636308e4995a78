/**
 * A code cell's result (src/service/code.ts CodeResult) as an MCP tool result: what an agent reads
 * is the text a notebook would show (stdout, stderr, each output's text/plain, the exception), and
 * each raster image as MCP image content, so a model that sees images sees the plot itself. SVG goes
 * as text (its markup): MCP clients commonly pass only raster image types on to models.
 *
 * structuredContent is the REST CodeResult with each image's base64 replaced by a pointer to its
 * image content, so a client that forwards both does not carry the bytes twice.
 */
import type { CallToolResult, ImageContent, TextContent } from '@modelcontextprotocol/sdk/types.js';
import type { CodeResult } from '../service/code.js';

/** MIME types sent as MCP image content: those MCP clients pass to models. */
const RASTER = ['image/png', 'image/jpeg'] as const;

export function codeResultContent(r: CodeResult): CallToolResult {
  const content: Array<TextContent | ImageContent> = [];
  const say = (text: string) => {
    const last = content[content.length - 1];
    if (last?.type === 'text') last.text += '\n' + text;
    else content.push({ type: 'text', text });
  };
  const n = r.execution_count ?? ' ';
  if (r.stdout) say(`stdout:\n${r.stdout.replace(/\n$/, '')}`);
  if (r.stderr) say(`stderr:\n${r.stderr.replace(/\n$/, '')}`);
  let images = 0;
  const results = r.results.map((out) => {
    const data = { ...out.data };
    const plain = typeof data['text/plain'] === 'string' ? data['text/plain'] : '';
    say(`${out.is_main_result ? `Out[${n}]:` : 'Display:'} ${plain}`.trimEnd());
    for (const mime of RASTER) {
      const b64 = data[mime];
      if (typeof b64 !== 'string') continue;
      content.push({ type: 'image', data: b64, mimeType: mime });
      data[mime] = `(image ${++images} of this result, sent as MCP image content)`;
    }
    if (typeof data['image/svg+xml'] === 'string') say(`image/svg+xml:\n${data['image/svg+xml']}`);
    return { ...out, data };
  });
  if (r.error) say(`${r.error.name}: ${r.error.value}${r.error.traceback ? `\n${r.error.traceback.replace(/\n$/, '')}` : ''}`);
  if (r.timed_out) say('(the cell ran past timeout_secs and was interrupted)');
  say(`[In [${n}], context ${r.context ?? '—'}, ${r.duration_ms} ms${r.seed ? `, seed ${r.seed}` : ''}]`);
  return { content, structuredContent: { ...r, results } };
}
