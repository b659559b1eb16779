/*
 * tests/support/one_rank_model.h — the one-rank model for tests: the whole chain as one CPU stage
 * at tp = 1 (engine/model/stage_cpu.h with one activation slot on mp_tp_comm_single), behind the
 * small API the tests that compare with a whole model use (gradients against finite differences,
 * transformers and PyTorch goldens, llm.c files). Its flat arrays are the parameter layout's (at
 * tp = 1 each shard is its whole tensor, in the layout's order). A run never uses it: the trainer
 * is the same stage at dp = pp = tp = 1.
 */
#ifndef MPENGINE_TESTS_SUPPORT_ONE_RANK_MODEL_H
#define MPENGINE_TESTS_SUPPORT_ONE_RANK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/model/param_layout.h"
#include "engine/model/stage_state.h"
#include "topology/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_gpt mp_gpt;

/* Checks that the runtime can train `model` and allocates parameters, gradients and the
 * activations of one micro-batch of (micro_batch, seq_len). MP_ERR_INPUT naming the model file
 * and the layer for models it cannot run, or a seq_len beyond the position table. */
mp_status mp_gpt_create(const mp_model *model, int micro_batch, int seq_len, mp_gpt **out,
                        mp_error *err);
void mp_gpt_free(mp_gpt *gpt);

const mp_model_config *mp_gpt_get_config(const mp_gpt *gpt);
const mp_param_layout *mp_gpt_get_layout(const mp_gpt *gpt);

/* The flat parameter and gradient arrays, mp_gpt_num_params floats each. */
size_t mp_gpt_num_params(const mp_gpt *gpt);
float *mp_gpt_params(mp_gpt *gpt);
float *mp_gpt_grads(mp_gpt *gpt);
int mp_gpt_num_tensors(const mp_gpt *gpt);
const mp_param_tensor *mp_gpt_tensor_at(const mp_gpt *gpt, int index);
/* The tensor called name, or NULL. */
const mp_param_tensor *mp_gpt_find_tensor(const mp_gpt *gpt, const char *name);

/* GPT-2 initialisation from seed (mp_param_layout_init_params). */
void mp_gpt_init_params(mp_gpt *gpt, uint64_t seed);

void mp_gpt_zero_grads(mp_gpt *gpt);

/* Forward of one micro-batch. inputs and targets are (B, T) token ids in [0, V) (checked by the
 * data layer). Returns the mean cross-entropy over the B * T tokens, in nats (it cannot fail: no
 * communication at tp = 1). The loss gradient is formed now, weighted by dloss: 1 for a lone
 * micro-batch, 1 / num_micro_batches when micro-batches accumulate. */
double mp_gpt_forward(mp_gpt *gpt, const int32_t *inputs, const int32_t *targets, float dloss);

/* Backward of the last forward: adds d(dloss * mean loss)/d(params) into the gradients. */
void mp_gpt_backward(mp_gpt *gpt);

/* The global gradient norm, the square root of the stage's sum of squares
 * (mp_stage_cpu_grad_norm_squared) as the trainer takes it before clipping. */
double mp_gpt_grad_norm(mp_gpt *gpt);

/* The stage's AdamW step (mp_stage_cpu_adamw) with settings (mp_trainer_adamw_settings gives a
 * step's): decay on the tensors the layout marks, the clip factor inside the update. The moments
 * are the stage's, zero before the first call. MP_OK, or the stage's error. */
mp_status mp_gpt_adamw(mp_gpt *gpt, const mp_stage_adamw *settings, mp_error *err);

/* Loads llm.c's GPT-2 checkpoint (version 3 fp32, or 5 bf16 converted to fp32). MP_ERR_INPUT
 * naming the file when it is not one, or when its header differs from the model (naming the
 * field and both values). */
mp_status mp_gpt_load_llmc(mp_gpt *gpt, const char *path, mp_error *err);

/* Writes the parameters as llm.c's version 3 (fp32) checkpoint, to a temporary name renamed into
 * place. */
mp_status mp_gpt_save_llmc(const mp_gpt *gpt, const char *path, mp_error *err);

/* Writes the gradients in the same file format, header and tensor order as mp_gpt_save_llmc
 * (d(loss)/d(wte) where the checkpoint holds wte, ...), so a peer implementation that loads the
 * checkpoint can compare its gradients tensor by tensor (tools/bench/torch_compare.py). */
mp_status mp_gpt_save_llmc_gradients(const mp_gpt *gpt, const char *path, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TESTS_SUPPORT_ONE_RANK_MODEL_H */
