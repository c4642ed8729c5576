/* optim.c: AdamW, clipping and the learning-rate schedule (see include/pt/optim.h). */
#include "pt/optim.h"

#include <math.h>
#include <stdlib.h>

void pt_optim_init(pt_optim *o, const pt_optim_config *cfg, const pt_model *model,
                   const pt_optim_range *ranges, int n_ranges) {
    o->cfg = *cfg;
    pt_optim_range whole = {0, model->table.total, 0, NULL, NULL};
    if (!ranges) {
        ranges = &whole;
        n_ranges = 1;
    }
    o->ranges = pt_malloc((size_t)n_ranges * sizeof *o->ranges);
    o->n_ranges = n_ranges;
    o->n = 0;
    for (int i = 0; i < n_ranges; i++) {
        o->ranges[i] = ranges[i];
        o->ranges[i].off = o->n;
        if (!o->ranges[i].param) {
            o->ranges[i].param = model->params + ranges[i].lo;
            o->ranges[i].grad = model->grads + ranges[i].lo;
        }
        o->n += ranges[i].hi - ranges[i].lo;
    }
    /* the norm's pieces: every (owned range ∩ tensor) of the tensors this rank owns */
    int cap = 0;
    o->pieces = NULL;
    o->n_pieces = 0;
    for (int r = 0; r < n_ranges; r++) {
        const pt_optim_range *rg = &o->ranges[r];
        for (int i = 0; i < model->table.n; i++) {
            const pt_param *p = &model->table.p[i];
            size_t lo = p->offset > rg->lo ? p->offset : rg->lo;
            size_t hi = p->offset + p->numel < rg->hi ? p->offset + p->numel : rg->hi;
            if (hi <= lo || !p->owner) continue;
            if (o->n_pieces == cap) {
                cap = cap ? 2 * cap : 64;
                o->pieces = pt_realloc(o->pieces, (size_t)cap * sizeof *o->pieces);
            }
            o->pieces[o->n_pieces++] = (pt_norm_piece){lo, hi, r, 0, 0.0};
        }
    }
    o->m = model->be->alloc(model->be, (o->n ? o->n : 1) * sizeof(float));
    o->v = model->be->alloc(model->be, (o->n ? o->n : 1) * sizeof(float));
    o->step = 0;
}

void pt_optim_free(pt_optim *o, const pt_model *model) {
    model->be->free(model->be, o->m);
    model->be->free(model->be, o->v);
    free(o->ranges);
    free(o->pieces);
    o->m = o->v = NULL;
    o->ranges = NULL;
    o->pieces = NULL;
}

/* Warmup–stable–decay: the peak until the cooldown's first step s0, then down to the floor over
 * the last N − s0 steps (Hägele et al. 2024: linear or 1 − √ of the cooldown's progress). */
static float pt_lr_wsd(const pt_optim_config *c, int64_t s) {
    int64_t n = c->total_steps, d = llround((double)c->decay_fraction * (double)n);
    int64_t s0 = n - d > c->warmup_steps ? n - d : c->warmup_steps;
    if (s < s0 || n <= s0) return c->lr;
    double q = (double)(s - s0) / (double)(n - s0);
    if (q > 1) q = 1;
    double floor_lr = (double)c->min_lr * c->lr;
    double shape = c->cooldown == PT_COOLDOWN_SQRT ? 1.0 - sqrt(q) : 1.0 - q;
    return (float)(floor_lr + (c->lr - floor_lr) * shape);
}

float pt_lr_at(const pt_optim_config *c, int64_t s) {
    if (c->warmup_steps > 0 && s < c->warmup_steps)
        return c->lr * (float)(s + 1) / (float)c->warmup_steps;
    if (c->schedule == PT_LR_CONSTANT) return c->lr;
    if (c->schedule == PT_LR_WSD) return pt_lr_wsd(c, s);
    int64_t span = c->total_steps - c->warmup_steps;
    if (span <= 0) return c->lr;
    double frac = (double)(s - c->warmup_steps) / (double)span;
    if (frac > 1) frac = 1;
    double floor_lr = (double)c->min_lr * c->lr;
    double shape = c->schedule == PT_LR_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    return (float)(floor_lr + (c->lr - floor_lr) * shape);
}

double pt_grad_norm(const pt_model *model) {
    return sqrt(model->be->sumsq(model->be, model->grads, model->table.total));
}

double pt_grad_sumsq_owned(pt_optim *o, const pt_model *model) {
    pt_optim_norm_begin(o);
    return pt_optim_norm_sumsq(o, model);
}

void pt_optim_norm_begin(pt_optim *o) {
    for (int k = 0; k < o->n_pieces; k++) o->pieces[k].covered = 0;
}

static void pt_norm_piece_sum(const pt_optim *o, const pt_model *model, pt_norm_piece *pc) {
    const pt_optim_range *rg = &o->ranges[pc->range];
    size_t n = pc->hi - pc->lo;
    pc->sumsq = model->be->sumsq(model->be, rg->grad + (pc->lo - rg->lo), n);
    pc->covered = n + 1; /* summed */
}

void pt_optim_norm_final(pt_optim *o, const pt_model *model, size_t lo, size_t hi) {
    for (int k = 0; k < o->n_pieces; k++) {
        pt_norm_piece *pc = &o->pieces[k];
        size_t a = pc->lo > lo ? pc->lo : lo, b = pc->hi < hi ? pc->hi : hi;
        if (b <= a || pc->covered > pc->hi - pc->lo) continue;
        pc->covered += b - a;
        if (pc->covered == pc->hi - pc->lo) pt_norm_piece_sum(o, model, pc);
    }
}

double pt_optim_norm_sumsq(pt_optim *o, const pt_model *model) {
    double ss = 0;
    for (int k = 0; k < o->n_pieces; k++) {
        pt_norm_piece *pc = &o->pieces[k];
        if (pc->covered <= pc->hi - pc->lo) pt_norm_piece_sum(o, model, pc);
        ss += pc->sumsq;
    }
    return ss;
}

float pt_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    /* torch computes max_norm / (total_norm + 1e-6) in fp32 and clamps it at 1 */
    float coef = max_norm / ((float)norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

void pt_optim_begin_step(pt_optim *o) { o->step++; }

void pt_optim_update_range(pt_optim *o, pt_model *model, int r, float lr, float grad_scale) {
    pt_backend *be = model->be;
    const pt_optim_range *rg = &o->ranges[r];
    /* every (owned range ∩ tensor) piece, with that tensor's weight decay */
    for (int i = 0; i < model->table.n; i++) {
        const pt_param *p = &model->table.p[i];
        size_t lo = p->offset > rg->lo ? p->offset : rg->lo;
        size_t hi = p->offset + p->numel < rg->hi ? p->offset + p->numel : rg->hi;
        if (hi <= lo) continue;
        float wd = p->decay ? o->cfg.weight_decay : 0.0f;
        size_t at = lo - rg->lo, moff = rg->off + at;
        be->adamw(be, rg->param + at, rg->grad + at, o->m + moff, o->v + moff, hi - lo, lr,
                  o->cfg.beta1, o->cfg.beta2, o->cfg.eps, wd, o->step, grad_scale);
    }
}

void pt_optim_step(pt_optim *o, pt_model *model, float lr, float grad_scale) {
    pt_optim_begin_step(o);
    for (int r = 0; r < o->n_ranges; r++) pt_optim_update_range(o, model, r, lr, grad_scale);
}
