/* optim.h: AdamW over the parameter buffer, global-norm gradient clipping, learning-rate schedule.
 *
 * The moments m and v are two more buffers laid out like the parameters (one table describes all
 * four). Weight decay is taken per tensor from the table (matrices yes, norm weights no). The
 * update runs over an element range so that ZeRO can apply it to a shard.
 */
#ifndef PT_OPTIM_H
#define PT_OPTIM_H

#include "pt/data_parallel.h"
#include "pt/model.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int schedule; /* PT_LR_* */
    int64_t warmup_steps, total_steps;
    float min_lr; /* fraction of lr */
    float decay_fraction; /* wsd: the share of total_steps that cools down */
    int cooldown;         /* wsd: PT_COOLDOWN_* */
} pt_optim_config;

enum { PT_LR_CONSTANT = 0, PT_LR_COSINE, PT_LR_LINEAR, PT_LR_WSD };
enum { PT_COOLDOWN_LINEAR = 0, PT_COOLDOWN_SQRT };

/* A range this optimizer owns (data_parallel.h), moments at m + off, v + off. One range
 * [0, total) without ZeRO; the rank's shard of every bucket with ZeRO. */
typedef pt_owned_range pt_optim_range;

/* A piece of the global norm: an owned range ∩ a tensor this rank owns (not a replica's), its Σ g²
 * once every element is final (covered counts them). */
typedef struct {
    size_t lo, hi;
    int range;
    size_t covered;
    double sumsq;
} pt_norm_piece;

typedef struct {
    pt_optim_config cfg;
    float *m, *v; /* (n) device memory: the owned ranges, one after another */
    size_t n;
    pt_optim_range *ranges;
    int n_ranges;
    int64_t step; /* optimizer steps taken */
    pt_norm_piece *pieces; /* the norm's pieces in the order Σ g² adds them (made at set-up) */
    int n_pieces;
} pt_optim;

/* ranges = NULL: the whole table. Otherwise the optimizer owns (and allocates moments for) just
 * those ranges of the parameter buffer. */
void pt_optim_init(pt_optim *o, const pt_optim_config *cfg, const pt_model *model,
                   const pt_optim_range *ranges, int n_ranges);
void pt_optim_free(pt_optim *o, const pt_model *model);
/* Learning rate of step s (from 0), with peak lr, floor f = min_lr·lr, W = warmup_steps and
 * N = total_steps (docs/guide.md, "Learning-rate schedules"):
 *   s < W          lr·(s+1)/W                                       (every schedule)
 *   constant       lr
 *   cosine         f + (lr−f)·½(1 + cos πp),  p = min(1, (s−W)/(N−W))
 *   linear         f + (lr−f)·(1 − p)
 *   wsd            lr until s0 = N − D (D = round(decay_fraction·N), s0 at least W), then
 *                  f + (lr−f)·(1 − q) (cooldown linear) or f + (lr−f)·(1 − √q) (sqrt),
 *                  q = min(1, (s−s0)/(N−s0)): lr at s0, f at s = N (after the last step). */
float pt_lr_at(const pt_optim_config *c, int64_t s);
/* Global L2 norm of the model's own gradient buffer (one process, no ZeRO). */
double pt_grad_norm(const pt_model *model);
/* Σ g² over the optimizer's ranges, within the table (the caller sums it over the ranks that
 * share the model; the square root of the sum is the global norm): each (owned range ∩ tensor
 * this rank owns) piece's Σ, added in the ranges' order. */
double pt_grad_sumsq_owned(pt_optim *o, const pt_model *model);
/* The same Σ piece by piece while the gradients become final (the data-parallel reductions
 * completing one bucket after another): pt_optim_norm_begin, then pt_optim_norm_final for each
 * range of the table [lo, hi) whose gradients are final (ranges disjoint; a piece is summed once
 * all of it was), then pt_optim_norm_sumsq sums the pieces not yet summed and adds them all in
 * the order pt_grad_sumsq_owned does: the same bits, whatever the order they were final in. */
void pt_optim_norm_begin(pt_optim *o);
void pt_optim_norm_final(pt_optim *o, const pt_model *model, size_t lo, size_t hi);
double pt_optim_norm_sumsq(pt_optim *o, const pt_model *model);
/* The factor torch.nn.utils.clip_grad_norm_ scales gradients by: max_norm / (norm + 1e-6) when
 * that is < 1, else 1 (and 1 when max_norm = 0, clipping off). */
float pt_clip_coef(double norm, float max_norm);
/* One AdamW step over the owned ranges with the given lr, on the gradients times grad_scale (the
 * clipping factor, folded into the update instead of a pass of its own), weight decay per tensor
 * from the table (the step counter advances). */
void pt_optim_step(pt_optim *o, pt_model *model, float lr, float grad_scale);
/* pt_optim_step in parts, so that the parameters of each range can leave (ZeRO's all-gather)
 * while the next is updated: pt_optim_begin_step advances the step counter, then
 * pt_optim_update_range updates range r (each range once; any order: the update is elementwise). */
void pt_optim_begin_step(pt_optim *o);
void pt_optim_update_range(pt_optim *o, pt_model *model, int r, float lr, float grad_scale);

#endif
