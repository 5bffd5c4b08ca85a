/* sched: the task queue and the execution slots (PRD 3.4, 3.5 queue timeout, 3.8.3).
 *
 * One scheduler holds every queued task of the process in a single structure ordered by
 * weighted fair queueing with aging, and counts the slots that running tasks hold:
 *
 *   - five priorities P0..P4; P0-P3 share by weight (100/50/25/10 by default), a waiting
 *     task rises one priority level per priority_aging_seconds, P4 runs only when no
 *     P0-P3 task is queued; reserved_realtime_slots of the global slots are for P0 only;
 *   - gates: a logical model (or route) has max_concurrency, an application and a user
 *     have max_running and max_queued. A task is dispatched only when the global cap and
 *     every gate it names have room and its KV-cache reservation fits device memory;
 *   - memory admission degrades before it waits (PRD 3.4.3): a task that does not fit as
 *     asked runs at once with a shorter output ceiling (down to its min_output_tokens),
 *     else on its smaller model (as asked, then shorter), and only then waits;
 *   - a lease, taken at dispatch, holds one unit at every level and the memory, and is
 *     given back exactly once by mg_sched_release();
 *   - queue deadlines (expire), backpressure levels, memory admission.
 *
 * Time is always the caller's: every function that needs it takes now_ms (monotonic
 * milliseconds; if a value goes backwards the scheduler keeps the largest seen). The
 * module makes no clock calls, no I/O and no logging, and is not thread-safe: one
 * scheduler belongs to one loop thread.
 *
 * Ordering. Each task gets a fixed key at enqueue:
 *
 *   tag = max(V, last tag of its priority if that priority has queued tasks) + cost[p]
 *   key = tag + offset[p] + enqueue time
 *
 * cost[p] = Q / weight[p] is the self-clocked fair queueing finish tag (V = the largest
 * tag dispatched so far): among backlogged priorities, dispatches follow the weights.
 * Q is scaled so that the widest gap between fresh tasks of adjacent levels P0..P3 is
 * the aging period A, and offset[p] = p*A - (cost[p] - cost[0]) pads the other gaps to
 * A as well, so a fresh P(k) task has key V + cost[0] + k*A + now. The enqueue-time term
 * is the aging: keys never change, yet a task that has waited w ms compares with a fresh
 * arrival as if it were w/A levels higher, because every later arrival carries a larger
 * time. Hence: after A ms an old P3 passes fresh P2 tasks (sooner if dispatches advanced
 * V meanwhile), nothing P0-P3 starves, and a fresh P0 goes before any non-P0 task that
 * has waited less than its level distance times A. aging_ms = 0 turns aging off (key = tag).
 *
 * Under contention the two parts combine: each level starts A behind the one above, then
 * backlogged levels share by weight (a P0 + P2 burst enqueued together with the defaults:
 * 12 P0, then 4 P0 per P2).
 *
 * Head-of-line rule. Dispatch takes the smallest-key ELIGIBLE task: a task whose model,
 * application or user is at its running cap, whose non-P0 slots are all taken, or whose
 * memory reservation does not fit, is passed over and does not hold back anyone else.
 * Tasks that share model, application, user and priority (a "flow") stay first-in
 * first-out: a flow waits as a whole while its oldest task cannot go. Internally the
 * ready set is one binary heap of flow heads; a flow found blocked is parked on the gate
 * that blocked it, and a gate with room and parked flows is itself one node of the ready
 * heap, keyed by its best parked flow, so parked flows come back exactly when they would
 * be next, and the choice is exact (the unit test checks it step by step against a brute
 * force). A P4 is eligible only while no P0-P3 task is queued, even a blocked one.
 *
 * Costs (n queued tasks, f flows, f <= n): enqueue O(log n) plus a scan of the flows
 * that share its user (or app, or model, when it names no user); cancel and expire
 * O(log n); dispatch O((1 + k) log n), k = flows moved between the ready heap and a gate
 * on the way (each blocked flow is moved once, then waits on its full gate); release
 * O(log n) per gate, except that freeing memory re-offers every flow waiting for memory.
 * Only enqueue and gate creation allocate; dispatch, release, cancel and expire cannot
 * fail. */
#ifndef MG_SCHED_H
#define MG_SCHED_H

#include <stddef.h>
#include <stdint.h>

/* ---- priorities ------------------------------------------------------------------- */

typedef enum mg_priority_e {
    MG_PRIO_P0 = 0, /* realtime */
    MG_PRIO_P1,
    MG_PRIO_P2, /* default */
    MG_PRIO_P3,
    MG_PRIO_P4, /* idle only */
    MG_PRIO_COUNT
} mg_priority_t;

#define MG_PRIO_DEFAULT MG_PRIO_P2

/* Parse a body priority "P0".."P4" (case-insensitive). Returns 0 and sets *out, or -1. */
int mg_priority_parse(const char *s, mg_priority_t *out);

/* Map an X-Priority header value: urgent=P0, high=P1, normal=P2, low=P3
 * (case-insensitive). Returns 0 and sets *out, or -1 for anything else. */
int mg_priority_from_header(const char *v, mg_priority_t *out);

/* "P0".."P4", or "P?" when out of range. Static. */
const char *mg_priority_name(mg_priority_t p);

/* ---- results ------------------------------------------------------------------------ */

#define MG_SCHED_OK 0
#define MG_SCHED_EINVAL (-1)      /* bad argument or configuration */
#define MG_SCHED_ENOMEM (-2)      /* out of memory; nothing changed */
#define MG_SCHED_EQUEUE_FULL (-3) /* a queued cap is reached: 429 QUEUE_FULL */
#define MG_SCHED_EOVERLOAD (-4)   /* backpressure rejects this priority: 503 + Retry-After */
#define MG_SCHED_ETOO_LARGE (-5)  /* the KV reservation can never fit: RESOURCE_EXHAUSTED */
#define MG_SCHED_ESTATE (-6)      /* entry not in the state the call needs */

/* The PRD 3.1.4 error code for a result: EQUEUE_FULL "QUEUE_FULL" (429 + Retry-After),
 * EOVERLOAD and ETOO_LARGE "RESOURCE_EXHAUSTED" (503; Retry-After for EOVERLOAD only),
 * anything else "INTERNAL_ERROR"; "OK" for 0. Static. */
const char *mg_sched_strerror(int rc);

/* ---- configuration ---------------------------------------------------------------- */

typedef struct mg_sched_config_s {
    uint32_t weight[MG_PRIO_COUNT];    /* WFQ weights, each >= 1; 100/50/25/10/1 */
    uint64_t aging_ms;                 /* priority_aging_seconds * 1000; 30000; 0 = off */
    uint32_t max_running;              /* global running slots; 8 */
    uint32_t max_queued;               /* global queued tasks; 500 */
    uint32_t reserved_realtime_slots;  /* of max_running, usable by P0 only; 2 */
    double level_threshold[3];         /* backpressure levels 1..3; 0.70, 0.85, 0.95 */
    uint32_t level2_max_output_tokens; /* max_output_tokens cap from level 2 on; 1024 */
    uint32_t model_max_running;        /* default max_concurrency of a new model gate; 0 */
    uint32_t app_max_running;          /* default for a new application gate; 0 */
    uint32_t app_max_queued;           /* 0 */
    uint32_t user_max_running;         /* users.default_max_running_tasks; 1 */
    uint32_t user_max_queued;          /* 0 */
    uint64_t vram_bytes;               /* device memory; 0 = no memory admission */
    double safety_margin_ratio;        /* context.safety_margin_ratio; 0.08 */
} mg_sched_config_t;
/* In every max_* field 0 means unlimited, except max_running and max_queued (>= 1). */

/* Fill c with the PRD defaults listed beside the fields. */
void mg_sched_config_defaults(mg_sched_config_t *c);

/* ---- device memory ------------------------------------------------------------------ */

/* KV-cache budget of one device: vram * (1 - safety_margin_ratio) - loaded weights.
 * A plain value type; the scheduler holds one, and it can be used alone. */
typedef struct mg_sched_mem_s {
    uint64_t vram_bytes;        /* 0 = unlimited (admission off) */
    double safety_margin_ratio; /* in [0, 1) */
    uint64_t weights_bytes;     /* sum of the loaded models' weight_bytes */
    uint64_t reserved_bytes;    /* KV cache reserved by running tasks */
} mg_sched_mem_t;

/* Start with nothing loaded or reserved. */
void mg_sched_mem_init(mg_sched_mem_t *m, uint64_t vram_bytes, double safety_margin_ratio);
/* Bytes available to KV reservations when nothing is reserved (0 when the weights alone
 * exceed the usable memory; UINT64_MAX when admission is off). */
uint64_t mg_sched_mem_budget(const mg_sched_mem_t *m);
/* Bytes that a reservation can take now (UINT64_MAX when admission is off). */
uint64_t mg_sched_mem_free(const mg_sched_mem_t *m);
/* Reserve bytes. Returns 0, or MG_SCHED_ETOO_LARGE when they do not fit (nothing taken). */
int mg_sched_mem_reserve(mg_sched_mem_t *m, uint64_t bytes);
/* Give back bytes taken by mg_sched_mem_reserve (clamped at 0). */
void mg_sched_mem_release(mg_sched_mem_t *m, uint64_t bytes);
/* Count a model's weights as loaded. Returns 0, or MG_SCHED_ETOO_LARGE when the weights
 * would exceed the usable memory or leave less than is reserved now (nothing changes). */
int mg_sched_mem_load(mg_sched_mem_t *m, uint64_t weight_bytes);
/* Forget weights counted by mg_sched_mem_load (clamped at 0). */
void mg_sched_mem_unload(mg_sched_mem_t *m, uint64_t weight_bytes);
/* reserved / budget in [0, 1] (0 when admission is off; 1 when the budget is 0). */
double mg_sched_mem_fraction(const mg_sched_mem_t *m);

/* ---- memory admission's degrade steps (PRD 3.4.3) -------------------------------- */

/* How dispatch made a task fit device memory: bits of mg_sched_entry_t.degraded. */
#define MG_SCHED_SHORTER 1u /* max_output_tokens lowered to what fits */
#define MG_SCHED_SMALLER 2u /* reserved with the entry's smaller model: run it there */

/* The output ceiling a task can have when its KV reservation, kv_per_token_bytes *
 * (input_tokens + ceiling), must fit free_bytes: asked itself when that fits (asked 0 means
 * no ceiling: only the input is reserved), else the largest value in [min_tokens, asked).
 * min_tokens 0 turns shortening off. Returns 0 and sets *ceiling, or MG_SCHED_ETOO_LARGE
 * when not even min_tokens fits (or asked does not and cannot be shortened). */
int mg_sched_fit_output(uint64_t free_bytes, uint64_t kv_per_token_bytes, uint32_t input_tokens,
                        uint32_t asked, uint32_t min_tokens, uint32_t *ceiling);

/* ---- scheduler, gates, entries, leases ------------------------------------------- */

typedef struct mg_sched_s mg_sched_t;
typedef struct mg_sched_gate_s mg_sched_gate_t; /* owned by the scheduler */
typedef struct mg_sched_flow_s mg_sched_flow_t; /* private */

typedef enum mg_sched_gate_kind_e {
    MG_GATE_MODEL = 0, /* a logical model or a route: max_concurrency */
    MG_GATE_APP,       /* an application: max_running_tasks, max_queued_tasks */
    MG_GATE_USER,      /* a user: max_running_tasks, max_queued_tasks */
    MG_GATE_KIND_COUNT
} mg_sched_gate_kind_t;

/* What a dispatched task holds: one global slot (a non-P0 slot too unless realtime),
 * one unit of each named gate, and mem_bytes of device memory. Lives inside the entry. */
typedef struct mg_sched_lease_s {
    mg_sched_t *sched;                         /* borrowed */
    mg_sched_gate_t *gate[MG_GATE_KIND_COUNT]; /* borrowed; NULL = none */
    uint64_t mem_bytes;                        /* KV bytes reserved */
    int realtime;                              /* P0: holds no non-P0 slot */
    int held;                                  /* 1 from dispatch until the first release */
} mg_sched_lease_t;

/* A task as the scheduler sees it. The caller owns the storage (typically embedded in
 * its request) and keeps it alive while it is queued or its lease is held. */
typedef struct mg_sched_entry_s {
    /* set by the caller before mg_sched_enqueue (mg_sched_entry_init gives defaults) */
    mg_priority_t priority;
    mg_sched_gate_t *gate[MG_GATE_KIND_COUNT]; /* model, app, user; NULL = no such limit */
    uint64_t deadline_ms;                      /* absolute queue deadline; 0 = none */
    uint32_t input_tokens;                     /* for the KV reservation */
    uint32_t max_output_tokens;                /* effective; enqueue may lower it (level 2),
                                                  so may dispatch (memory admission) */
    uint32_t min_output_tokens; /* memory admission may shorten the output to this, rather
                                   than wait; 0 = never shorten */
    mg_sched_gate_t *smaller;   /* a model gate holding a smaller model's memory figures: when
                                   even the shortest output does not fit, the task may run
                                   there; NULL = none. Memory only: its slots are not counted */
    void *data;                 /* the caller's; never touched */
    /* called by the dispatch pump (pump.h), never by the scheduler itself: the entry got its
       slot, or its queue deadline passed (it left the queue). Either may free the entry. */
    void (*on_dispatch)(struct mg_sched_entry_s *e);
    void (*on_expire)(struct mg_sched_entry_s *e);

    /* read-only for the caller */
    uint64_t enqueued_ms;   /* the scheduler's time at enqueue */
    unsigned degraded;      /* after dispatch: MG_SCHED_SHORTER | MG_SCHED_SMALLER, or 0 */
    mg_sched_lease_t lease; /* valid after dispatch */

    /* private to sched.c */
    uint64_t key_, tag_, seq_, mem_bytes_;
    mg_sched_flow_t *flow_;
    struct mg_sched_entry_s *prev_, *next_;
    size_t dl_index_;
    int queued_;
} mg_sched_entry_t;

typedef struct mg_sched_stats_s {
    uint32_t running;          /* leases held */
    uint32_t running_realtime; /* of which P0 */
    uint32_t queued;           /* tasks queued */
    uint32_t queued_by_prio[MG_PRIO_COUNT];
    uint64_t mem_reserved_bytes;
    uint64_t mem_budget_bytes;
    double load;         /* mg_sched_load */
    int level;           /* mg_sched_level */
    uint64_t heap_moves; /* heap elements moved so far: a machine-independent cost measure */
} mg_sched_stats_t;

/* Create a scheduler with a copy of cfg. Returns NULL when cfg is invalid (max_running
 * or max_queued 0, reserved slots >= max_running, a weight 0, thresholds not ascending,
 * safety margin outside [0,1)) or memory runs out. Free with mg_sched_free. */
mg_sched_t *mg_sched_new(const mg_sched_config_t *cfg);

/* Free s and its gates. Entries still queued are detached (not freed: they are the
 * caller's). Every lease must have been released before; gate pointers die with s. */
void mg_sched_free(mg_sched_t *s);

/* Apply a new configuration (reload). Keys of queued tasks stay as they were; new
 * weights and aging apply to tasks enqueued from now on; existing gates keep their
 * limits. Returns 0, or MG_SCHED_EINVAL (nothing changed). */
int mg_sched_reconfigure(mg_sched_t *s, const mg_sched_config_t *cfg);

/* The gate of this kind and name, created on first use with the configured defaults.
 * Gates live until mg_sched_free, so the pointer may be kept. Returns NULL for a bad
 * kind, a NULL name or out of memory. name is copied. */
mg_sched_gate_t *mg_sched_gate(mg_sched_t *s, mg_sched_gate_kind_t kind, const char *name);

/* Set a gate's caps (0 = unlimited). Lowering below the current counts refuses nothing
 * already admitted; raising max_running lets waiting tasks go at the next dispatch. */
void mg_sched_gate_limits(mg_sched_t *s, mg_sched_gate_t *g, uint32_t max_running,
                          uint32_t max_queued);

/* The gate's running (leases held) and queued counts. */
uint32_t mg_sched_gate_running(const mg_sched_gate_t *g);
uint32_t mg_sched_gate_queued(const mg_sched_gate_t *g);

/* Memory figures of a model gate: weight_bytes counted while loaded, and KV bytes per
 * token, so a task reserves kv_per_token_bytes * (input_tokens + max_output_tokens). */
void mg_sched_model_memory(mg_sched_t *s, mg_sched_gate_t *model, uint64_t weight_bytes,
                           uint64_t kv_per_token_bytes);

/* Mark a model loaded (1) or unloaded (0), moving its weights into or out of the budget.
 * Returns 0, MG_SCHED_ETOO_LARGE when the weights do not fit (see mg_sched_mem_load), or
 * MG_SCHED_EINVAL for a non-model gate. Idempotent. */
int mg_sched_model_load(mg_sched_t *s, mg_sched_gate_t *model, int loaded);

/* Reset e for a new task: priority p, no gates, no deadline, no tokens, no lease. Not
 * while e is queued or holds its lease (that lease would never be given back). */
void mg_sched_entry_init(mg_sched_entry_t *e, mg_priority_t p);

/* Queue e at now_ms. In order, it refuses with:
 *   MG_SCHED_EINVAL     NULL argument or priority out of range;
 *   MG_SCHED_ESTATE     e is already queued or still holds its lease;
 *   MG_SCHED_EQUEUE_FULL the global or a gate's (application, user) queued cap is reached;
 *   MG_SCHED_EOVERLOAD  the backpressure level rejects e->priority;
 *   MG_SCHED_ETOO_LARGE the reservation exceeds the whole memory budget even with every
 *                       degrade step e allows (shortest output, smaller model);
 *   MG_SCHED_ENOMEM.
 * From level 2 on it lowers e->max_output_tokens to level2_max_output_tokens (0 counts as
 * unlimited) before sizing the reservation; the caller forwards the lowered value.
 * On success e is queued (borrowed until it leaves by dispatch, cancel or expire). */
int mg_sched_enqueue(mg_sched_t *s, mg_sched_entry_t *e, uint64_t now_ms);

/* Take the next task: the smallest-key eligible one (see the head-of-line rule above),
 * or NULL when none can go now. The returned entry has left the queue and holds
 * e->lease (release it with mg_sched_release however the task ends). Memory decides
 * in the PRD's degrade order: as asked; shorter (e->min_output_tokens); e->smaller as
 * asked, then shorter; else the task waits. e->degraded says which step it took, and
 * e->max_output_tokens holds the ceiling the caller must forward. */
mg_sched_entry_t *mg_sched_dispatch(mg_sched_t *s, uint64_t now_ms);

/* Tasks waiting in the queue. */
uint32_t mg_sched_queued(const mg_sched_t *s);

/* The entry mg_sched_dispatch would return now, left queued; NULL if none. */
mg_sched_entry_t *mg_sched_peek(mg_sched_t *s);

/* Give back every unit the lease holds. The first call releases and returns 0; any
 * later call (or a lease never held) does nothing and returns 1. Waiting tasks that the
 * freed units make eligible go at the next dispatch. */
int mg_sched_release(mg_sched_lease_t *lease);

/* Remove a queued entry (client cancel). Returns 0, or MG_SCHED_ESTATE if e is not
 * queued. No lease is involved: a queued task holds none. */
int mg_sched_cancel(mg_sched_t *s, mg_sched_entry_t *e);

/* The earliest queue deadline among queued entries: 0 and *deadline_ms set, or
 * MG_SCHED_ESTATE when no queued entry has one. Arm one timer for it. */
int mg_sched_next_deadline(const mg_sched_t *s, uint64_t *deadline_ms);

/* Remove and return one queued entry whose deadline is <= now_ms (earliest first), or
 * NULL. Call until NULL; each returned entry is out of the queue and holds no lease. */
mg_sched_entry_t *mg_sched_expire(mg_sched_t *s, uint64_t now_ms);

/* ---- backpressure ----------------------------------------------------------------- */

/* max(running / max_running, queued / max_queued, memory reserved / budget). */
double mg_sched_load(const mg_sched_t *s);

/* The level 0..3 for a load under cfg's thresholds (load >= threshold[i] gives i + 1). */
int mg_sched_level_for(const mg_sched_config_t *cfg, double load);

/* mg_sched_level_for(config, mg_sched_load(s)). */
int mg_sched_level(const mg_sched_t *s);

/* Whether new tasks of priority p are admitted at level: 0 all; 1 all but P4;
 * 2 P0-P2; 3 P0-P1. */
int mg_sched_level_admits(int level, mg_priority_t p);

/* Fill *st with the current counts. */
void mg_sched_stats(const mg_sched_t *s, mg_sched_stats_t *st);

#endif
