/** The HTTP server's own metrics: requests and latency by route and status, and readiness. */
import type { FastifyInstance } from 'fastify';
import { Counter, Gauge, Histogram, type MetricsRegistry } from '../service/metrics.js';

const startedAt = Symbol('startedAt');

export function registerHttpMetrics(app: FastifyInstance, metrics: MetricsRegistry, ready: () => boolean): void {
  const httpRequests = metrics.register(new Counter('collimate_http_requests_total', 'HTTP requests by route and status.'));
  const httpDuration = metrics.register(new Histogram('collimate_http_request_duration_seconds', 'HTTP request latency by route.'));
  metrics.register(new Gauge('collimate_ready', '1 once the service is ready (catalog templates warm).', () => [{ labels: {}, value: ready() ? 1 : 0 }]));

  app.addHook('onRequest', async (req) => {
    (req as unknown as Record<symbol, bigint>)[startedAt] = process.hrtime.bigint();
  });
  app.addHook('onResponse', async (req, reply) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const t0 = (req as unknown as Record<symbol, bigint | undefined>)[startedAt] ?? process.hrtime.bigint();
    httpRequests.inc({ method: req.method, route, status: String(reply.statusCode) });
    httpDuration.observe(Number(process.hrtime.bigint() - t0) / 1e9, { method: req.method, route });
  });
}
