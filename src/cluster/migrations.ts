/**
 * The cluster schema, one entry per version, applied in order by migrateCluster (db.ts) and never
 * edited once released: a change is a new entry. Times the cluster reasons about (heartbeats,
 * leases) are timestamptz from the database's clock, now(), never a host's.
 */
export const CLUSTER_MIGRATIONS: readonly string[] = [
  // 1: hosts, the sandbox directory, cap reservations, tenants and keys, idempotency.
  `
  CREATE TABLE cluster_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
  );
  -- The secret hosts present to each other on proxied requests (x-collimate-cluster).
  INSERT INTO cluster_settings (name, value) VALUES ('peer_secret', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

  CREATE TABLE hosts (
    id            text PRIMARY KEY,
    address       text NOT NULL,
    -- Running sandboxes the host takes at most; 0: an API-only node.
    capacity      integer NOT NULL CHECK (capacity >= 0),
    -- Compatibility class: snapshots and fork points restore only within one.
    qemu_version  text NOT NULL,
    machine       text NOT NULL,
    cpu_model     text NOT NULL,
    accel         text NOT NULL,
    compat        text NOT NULL,
    state         text NOT NULL CHECK (state IN ('alive', 'dead')),
    -- Bumped at every (re)registration and when the host is marked dead: a heartbeat of an older epoch is refused.
    epoch         bigint NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    lease_until   timestamptz NOT NULL,
    registered_at timestamptz NOT NULL,
    -- Reported with each heartbeat: templates it can create from, and ready warm VMMs per template.
    templates     text[] NOT NULL DEFAULT '{}',
    warm_pools    jsonb NOT NULL DEFAULT '{}'
  );

  CREATE TABLE tenants (
    id         text PRIMARY KEY,
    tier       text NOT NULL,
    created_at bigint NOT NULL
  );

  CREATE TABLE api_keys (
    id           text PRIMARY KEY,
    tenant       text NOT NULL REFERENCES tenants (id),
    hash         text NOT NULL UNIQUE,
    prefix       text NOT NULL,
    name         text,
    created_at   bigint NOT NULL,
    last_used_at bigint,
    revoked_at   bigint
  );
  CREATE INDEX api_keys_tenant ON api_keys (tenant);

  -- The sandbox directory: which host owns each sandbox, its state, and its last view (for listing).
  CREATE TABLE sandboxes (
    id         text PRIMARY KEY,
    tenant     text NOT NULL,
    host_id    text NOT NULL REFERENCES hosts (id),
    host_epoch bigint NOT NULL,
    state      text NOT NULL CHECK (state IN ('running', 'suspended', 'lost')),
    view       jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX sandboxes_tenant_state ON sandboxes (tenant, state);
  CREATE INDEX sandboxes_host_state ON sandboxes (host_id, state);

  -- Slots held by creates, forks and resumes in flight: they count against the tenant's cap and the
  -- host's capacity until the sandbox is in the directory or the lease runs out.
  CREATE TABLE reservations (
    id          text PRIMARY KEY,
    tenant      text NOT NULL,
    host_id     text NOT NULL REFERENCES hosts (id),
    slots       integer NOT NULL CHECK (slots > 0),
    lease_until timestamptz NOT NULL
  );
  CREATE INDEX reservations_tenant ON reservations (tenant);
  CREATE INDEX reservations_host ON reservations (host_id);

  CREATE TABLE idempotency (
    tenant      text NOT NULL,
    key         text NOT NULL,
    fingerprint text NOT NULL,
    -- pending: a node runs it now (until lease_until); done: status and body are the answer.
    state       text NOT NULL CHECK (state IN ('pending', 'done')),
    status      integer,
    body        jsonb,
    lease_until timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
  );

  `,
  // 2: where each blob lives (layers by erofs digest, artifact files), for hosts to pull by digest.
  `
  CREATE TABLE blob_locations (
    digest      text NOT NULL CHECK (digest ~ '^sha256:[a-f0-9]{64}$'),
    host_id     text NOT NULL REFERENCES hosts (id),
    -- layer, artifact-mem, artifact-state, artifact-disk (src/images/localBlobs.ts)
    kind        text NOT NULL,
    size        bigint NOT NULL CHECK (size >= 0),
    -- The layer's diff id, or the artifact's key.
    of          text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (digest, host_id)
  );
  CREATE INDEX blob_locations_host ON blob_locations (host_id);
  `,
  // 3: usage across hosts (each host's metering intervals, pushed from its SQLite); when a sweep
  // marks a sandbox lost, its open interval ends then and a notification says so (GET /v1/events).
  `
  CREATE TABLE usage_intervals (
    host_id        text NOT NULL,
    -- The interval's id in the host's own SQLite: (host_id, local_id) makes a push idempotent.
    local_id       bigint NOT NULL,
    tenant         text NOT NULL,
    sandbox        text NOT NULL,
    template       text NOT NULL,
    state          text NOT NULL CHECK (state IN ('running', 'suspended')),
    vcpus          double precision NOT NULL,
    memory_mib     double precision NOT NULL,
    disk_mib       double precision NOT NULL,
    snapshot_bytes double precision NOT NULL,
    expires_ms     bigint,
    start_ms       bigint NOT NULL,
    end_ms         bigint,
    PRIMARY KEY (host_id, local_id)
  );
  CREATE INDEX usage_intervals_tenant ON usage_intervals (tenant, start_ms);

  CREATE FUNCTION notify_sandbox_lost() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    -- Not charged past the moment the cluster declared it lost, whatever its host says on return.
    UPDATE usage_intervals SET end_ms = GREATEST(start_ms, (extract(epoch FROM now()) * 1000)::bigint)
      WHERE host_id = NEW.host_id AND sandbox = NEW.id AND end_ms IS NULL;
    PERFORM pg_notify('collimate_sandbox_events', json_build_object(
      'tenant', NEW.tenant, 'id', NEW.id, 'op', 'lost', 'state', 'deleted', 'host', NEW.host_id)::text);
    RETURN NEW;
  END $$;
  CREATE TRIGGER sandboxes_lost AFTER UPDATE OF state ON sandboxes
    FOR EACH ROW WHEN (NEW.state = 'lost' AND OLD.state <> 'lost') EXECUTE FUNCTION notify_sandbox_lost();
  `,
  // 4: the key environment secrets are sealed with on cluster hosts (src/cluster/secretsKey.ts), so
  // that every host opens an environment's secrets. 32 bytes as hex: sha256 over two random UUIDs
  // (244 random bits; both functions are in core PostgreSQL, no pgcrypto).
  `
  INSERT INTO cluster_settings (name, value)
  VALUES ('secrets_key', encode(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex'));
  `,
  // 5: environments across hosts (src/cluster/environments.ts): each environment a host made, as
  // GET /v1/environments shows it, and once it is ready what another host needs to create from it
  // (its configuration with the sealed secrets, its image's runtime and layers, its artifact).
  `
  CREATE TABLE environments (
    tenant      text NOT NULL,
    name        text NOT NULL,
    -- The host that made (bakes, owns) it: its log, its delete and its bake are there.
    host_id     text NOT NULL REFERENCES hosts (id),
    -- Its creation time (ms) on that host: a name deleted and made again is another generation.
    generation  bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('pending', 'baking', 'ready', 'failed')),
    -- The compatibility class its artifact was baked in: only hosts of that class restore it.
    compat      text NOT NULL,
    -- JSON as text, not jsonb: a bake log's tail and a layer's facts may hold NUL, which jsonb refuses.
    view        text NOT NULL,
    -- Set once ready and its artifact is known (environments.ts EnvironmentCopy); null before.
    copy        text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
  );
  CREATE INDEX environments_host ON environments (host_id);
  `,
  // 6: E2B sandboxes' envVars (src/cluster/sandboxEnvs.ts), which any host's envd applies to the
  // commands it starts: a sandbox created through one host is driven through any other.
  `
  CREATE TABLE e2b_sandbox_env (
    sandbox  text PRIMARY KEY,
    env      text NOT NULL
  );
  `,
  // 7: who a sandbox's access tokens were issued to, and their generation (src/cluster/sandboxGrants.ts):
  // any host checks a token, and revoking the key or rotating ends it on every host.
  `
  CREATE TABLE sandbox_grants (
    sandbox     text PRIMARY KEY,
    key_id      text,
    generation  integer NOT NULL
  );
  `,
];
