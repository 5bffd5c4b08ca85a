/* setup: the scheduler as the configuration describes it: its settings, the gate of every
 * logical model with its concurrency limit and memory figures, and the gates of the smaller
 * routes memory admission may move a task to. Loop thread (or start-up). */
#ifndef MG_SCHED_SETUP_H
#define MG_SCHED_SETUP_H

#include "conf/config.h"
#include "sched/sched.h"

/* The scheduler settings of cfg into *sc. */
void mg_sched_setup_config(const mg_config_t *cfg, mg_sched_config_t *sc);

/* Per-model concurrency limits and memory figures from cfg, and those of smaller routes. A
 * model with weight_bytes counts as loaded (resident); its tasks reserve KV cache while
 * they run. A model whose weights do not fit is logged. */
void mg_sched_setup_models(mg_sched_t *s, const mg_config_t *cfg);

/* The memory gate of a smaller route with its own memory figures (created on first use),
 * named after its upstream model: routes that serve the same smaller model share its
 * weights. NULL for any other route, or when out of memory. */
mg_sched_gate_t *mg_sched_smaller_gate(mg_sched_t *s, const mg_route_conf_t *r);

#endif
