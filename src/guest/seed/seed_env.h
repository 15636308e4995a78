/*
 * Per-exec seed environment for the guest agent.
 *
 * For an exec with seed S the agent adds to the exec's environment:
 *   LD_PRELOAD=<path of libcollimate-seed.so>[:<existing LD_PRELOAD>]
 *   COLLIMATE_SEED=<S in decimal>
 *   PYTHONHASHSEED=<collimate_python_hash_seed(S) in decimal>
 * and removes any inherited COLLIMATE_SEED_LINEAGE and COLLIMATE_SEED_NODE_ARG
 * (the library's own bookkeeping; a stale value would make the exec a
 * "descendant" of some earlier process). See docs/determinism.md.
 *
 * Header-only so the (static, musl) agent needs no extra object file.
 */
#ifndef COLLIMATE_SEED_ENV_H
#define COLLIMATE_SEED_ENV_H

#include <stdint.h>
#include <stdio.h>

/* splitmix64's finalizer: a bijective mix, so nearby seeds (1, 2, 3...) give
 * unrelated hash seeds rather than PYTHONHASHSEED=1, 2, 3. */
static inline uint64_t collimate_seed_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* PYTHONHASHSEED accepts 0..4294967295 (0 disables randomization, which is
 * also deterministic, so no value needs avoiding). */
static inline uint32_t collimate_python_hash_seed(uint64_t seed)
{
    return (uint32_t)collimate_seed_mix(seed);
}

/* Format the two value-carrying entries. Buffers of 48 bytes are enough
 * ("COLLIMATE_SEED=" + 20 digits, "PYTHONHASHSEED=" + 10 digits). */
#define COLLIMATE_SEED_ENTRY_MAX 48
static inline void collimate_seed_env_entries(uint64_t seed, char seed_entry[COLLIMATE_SEED_ENTRY_MAX],
                                              char hash_entry[COLLIMATE_SEED_ENTRY_MAX])
{
    snprintf(seed_entry, COLLIMATE_SEED_ENTRY_MAX, "COLLIMATE_SEED=%llu", (unsigned long long)seed);
    snprintf(hash_entry, COLLIMATE_SEED_ENTRY_MAX, "PYTHONHASHSEED=%lu",
             (unsigned long)collimate_python_hash_seed(seed));
}

#endif
