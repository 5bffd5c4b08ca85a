/* ping: keep-alives on client streams whose upstream is silent (protocols.ping_interval_ms).
 *
 * One timer for the pipeline walks the calls in flight; a call whose stream reached the
 * client, whose upstream is still sending and whose last write to the client is an interval
 * old gets one keep-alive in the client's protocol: ": ping" (an SSE comment every SSE
 * client skips) on OpenAI-wire and Responses streams, Anthropic's `event: ping` on a Messages
 * stream. A client that reads slower than we write (paused) gets none: it has bytes
 * waiting already. Proxies and SDKs with idle timeouts then keep a stream open through a
 * long prefill or a reasoning pause. */
#ifndef MG_PIPELINE_PING_H
#define MG_PIPELINE_PING_H

#include "pipeline/pipeline.h"

/* Start the pipeline's ping timer (pl->ping_timer); it reads the interval of the current
 * generation at each tick, so a reload changes it. */
void mg_ping_start(mg_pipeline_t *pl);
/* Stop and close it (at shutdown). */
void mg_ping_stop(mg_pipeline_t *pl);

#endif
