/* calib: the pipeline's calibrated estimate for models without a known tokenizer.
 *
 * Where a call needs its prompt's tokens and its model has no loaded encoding, the body's
 * bytes are divided by a bytes-per-token value learned per route (token/calib.h). The usage
 * of an answer without one (what is charged, marked estimated) takes its route's value, the
 * best estimate either way; a reservation before routing (admission, the TPM reservation,
 * spend limits, the wallet's hold) takes the smallest value learned among the model's
 * routes but never more than 4: a route that learned its prompts take more tokens (CJK,
 * code) reserves more, one that learned they take fewer still reserves bytes / 4, so a
 * reservation never shrinks below what it was. Unknown routes read 4. Every answer of such a model
 * whose upstream reported its prompt tokens teaches its route (at the call's finish) and is
 * observed in moongate_token_estimate_error_ratio{provider,model} (the estimate's relative error
 * before learning) and moongate_token_estimate_bytes_per_token{provider,model} (the value learned).
 *
 * Kept in the store's token_calibration table (fire and forget, through the writer: at the
 * first MG_CALIB_WARMUP answers of a route, then at most every MG_CALIB_SAVE_MS; a kill -9
 * loses at most that much learning) and reloaded at start-up. Loop thread. */
#ifndef MG_PIPELINE_CALIB_H
#define MG_PIPELINE_CALIB_H

#include "pipeline/pipeline.h"

#define MG_CALIB_SAVE_MS 5000

/* Fill pl->calib from pl->store (start-up, before serving; it reads synchronously) and set
 * the gauges of what it loaded. 0, or -1 (logged; the estimate starts from the default). */
int mg_pipeline_calib_load(mg_pipeline_t *pl);

#endif
