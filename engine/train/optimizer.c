/* engine/train/optimizer.c — the optimizer step after the gradients are final: clipping by the
 * global norm and AdamW, on the CPU's arrays or the GPU stage's, then ZeRO's parameter gather. */
#include "engine/train/trainer_internal.h"

#include "engine/model/stage_gpu.h"
#include "layers/adamw.h"

/* AdamW over elements [first, first + count) of a chunk's parameters, tensor by tensor (weight
 * decay is a property of the tensor), with the gradients times grad_scale (the clip factor);
 * grads, m and v hold that range only. */
static void adamw_range(mp_stage_cpu *chunk, size_t first, size_t count, float *grads, float *m,
                        float *v, const mp_training_config *t, double lr, int64_t step,
                        float grad_scale) {
  const size_t end = first + count;
  for (int i = 0; i < mp_stage_layout_num_tensors(mp_stage_cpu_layout(chunk)); ++i) {
    const mp_stage_tensor *tensor = mp_stage_layout_tensor(mp_stage_cpu_layout(chunk), i);
    const size_t lo = tensor->offset > first ? tensor->offset : first;
    const size_t hi = tensor->offset + tensor->count < end ? tensor->offset + tensor->count : end;
    if (lo >= hi) continue;
    /* Where the stage keeps them (with ZeRO-3 not at their offsets: the part's own). */
    float *params = mp_stage_cpu_params_at(chunk, lo, hi - lo);
    mp_adamw_update_scaled_cpu(params, grads + (lo - first), m + (lo - first),
                               v + (lo - first),
                               hi - lo, (float)lr, (float)t->beta1, (float)t->beta2,
                               (float)t->eps,
                               tensor->full->weight_decay ? (float)t->weight_decay : 0.0f,
                               (int)(step + 1), grad_scale);
  }
}

/* AdamW on chunk c's part of the parameters (all of them without ZeRO), its gradients times
 * clip_scale: on the CPU inside the update (no pass of its own), on the GPU a scaling pass, then
 * the device's AdamW, which refreshes the bf16 working copy of what it updated. */
static mp_status update_chunk(mp_trainer *trainer, int c, double lr, float clip_scale,
                              mp_error *err) {
  const mp_training_config *t = &trainer->plan->training;
  if (trainer->gpu_chunks != NULL) {
    mp_stage_gpu *gpu = trainer->gpu_chunks[c];
    const mp_gpu_adamw adamw = {(float)lr, (float)t->beta1, (float)t->beta2, (float)t->eps,
                                (float)t->weight_decay, (int)(trainer->step + 1), t->grad_clip};
    if (clip_scale != 1.0f) mp_stage_gpu_scale_grads(gpu, clip_scale);
    return mp_stage_gpu_adamw(gpu, &adamw, err);
  }
  mp_stage_cpu *chunk = trainer->chunks[c];
  const size_t first = trainer->zero_first[c], count = trainer->zero_count[c];
  float *grads = trainer->grad_part != NULL ? trainer->grad_part[c]
                                            : mp_stage_cpu_grads(chunk) + first;
  adamw_range(chunk, first, count, grads, trainer->chunk_m[c], trainer->chunk_v[c], t, lr,
              trainer->step, clip_scale);
  return MP_OK;
}

mp_status mp_train_optimizer_step(mp_trainer *trainer, double lr, double grad_norm,
                                  mp_error *err) {
  const float clip_scale = mp_clip_scale(grad_norm, trainer->plan->training.grad_clip);
  for (int c = 0; c < trainer->num_chunks; ++c) {
    MP_TRY(update_chunk(trainer, c, lr, clip_scale, err));
    MP_TRY(mp_train_zero_gather_updated(trainer, c, err));
  }
  return MP_OK;
}
