/* test_train.c: the training loop end to end on a tiny model: bitwise resume, checkpoint
 * integrity and rotation, accumulation invariance, the learning-rate schedule, init_from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pt/checkpoint.h"
#include "pt/data.h"
#include "pt/safetensors.h"
#include "pt/trainer.h"
#include "testutil.h"

#define STEPS 6

static const char *shard_glob(void) {
    static char glob[600];
    if (!glob[0]) {
        char path[600];
        size_t n = 20000;
        uint16_t *t = malloc(n * 2);
        /* a learnable sequence: mostly a repeating pattern, some noise */
        uint64_t s = 12345;
        for (size_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            t[i] = (s >> 60) == 0 ? (uint16_t)((s >> 33) % 97) : (uint16_t)((i * 7) % 97);
        }
        snprintf(path, sizeof path, "%s/train_000000.bin", tu_tmpdir());
        assert_int_equal(pt_shard_write(path, t, n), PT_OK);
        free(t);
        snprintf(glob, sizeof glob, "%s/train_*.bin", tu_tmpdir());
    }
    return glob;
}

static void tiny_config(pt_config *c, const char *ckpt_dir) {
    pt_config_defaults(c);
    char *args[] = {"--model.vocab_size=97", "--model.dim=32",  "--model.n_layers=2",
                    "--model.n_heads=4",     "--model.n_kv_heads=2", "--model.ffn_dim=48",
                    "--model.max_seq_len=32", "--training.seq_len=16", "--training.global_batch=4",
                    "--training.micro_batch=2", "--training.threads=2", "--optimizer.lr=3e-3",
                    "--optimizer.warmup_steps=2", "--data.shuffle=true"};
    assert_int_equal(pt_config_from_args(c, (int)(sizeof args / sizeof *args), args), PT_OK);
    c->training.steps = STEPS;
    snprintf(c->data.train, sizeof c->data.train, "%s", shard_glob());
    snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s", ckpt_dir ? ckpt_dir : "");
}

/* Saves t as step `step` under dir, keeping `keep`. */
static pt_status save_as(pt_trainer *t, const char *dir, int64_t step, int keep) {
    int64_t saved = t->step;
    snprintf(t->cfg.checkpoint.dir, sizeof t->cfg.checkpoint.dir, "%s", dir);
    t->cfg.checkpoint.keep = keep;
    t->step = step;
    pt_status st = pt_trainer_save(t);
    t->step = saved;
    return st;
}

/* Loads a checkpoint's state into t. */
static pt_status load_state(pt_trainer *t, const char *dir, int64_t *step) {
    pt_status st = pt_trainer_load(t, dir);
    *step = t->step;
    return st;
}

static void init_or_fail(pt_trainer *t, const pt_config *c) {
    if (pt_trainer_init(t, c) != PT_OK) fail_msg("trainer init: %s", pt_last_error());
}

static void test_resume_is_bitwise(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/resume", tu_tmpdir());
    pt_config c;
    tiny_config(&c, dir);

    /* uninterrupted */
    pt_trainer a;
    init_or_fail(&a, &c);
    double losses[STEPS];
    for (int s = 0; s < STEPS; s++) {
        pt_step_stats st;
        assert_int_equal(pt_trainer_step(&a, &st), PT_OK);
        losses[s] = st.loss;
    }
    assert_true(losses[STEPS - 1] < losses[0]); /* it learns */

    /* stopped after 3 steps, saved, resumed in a new trainer */
    pt_trainer b;
    init_or_fail(&b, &c);
    for (int s = 0; s < 3; s++) {
        pt_step_stats st;
        assert_int_equal(pt_trainer_step(&b, &st), PT_OK);
    }
    assert_int_equal(save_as(&b, dir, b.step, 2), PT_OK);
    pt_trainer_free(&b);
    snprintf(c.checkpoint.resume, sizeof c.checkpoint.resume, "latest");
    pt_trainer r;
    init_or_fail(&r, &c);
    assert_int_equal(r.step, 3);
    for (int s = 3; s < STEPS; s++) {
        pt_step_stats st;
        assert_int_equal(pt_trainer_step(&r, &st), PT_OK);
        if (memcmp(&st.loss, &losses[s], sizeof(double)) != 0)
            fail_msg("step %d: resumed loss %.17g != uninterrupted %.17g", s + 1, st.loss, losses[s]);
    }
    const float *dev[3][2] = {{r.model.params, a.model.params}, {r.opt.m, a.opt.m},
                              {r.opt.v, a.opt.v}};
    for (int i = 0; i < 3; i++) {
        float *hr = tu_download(r.be, dev[i][0], a.model.table.total);
        float *ha = tu_download(a.be, dev[i][1], a.model.table.total);
        assert_memory_equal(hr, ha, a.model.table.total * sizeof(float));
        free(hr), free(ha);
    }
    pt_trainer_free(&r);
    pt_trainer_free(&a);
}

static void test_accumulation_does_not_change_the_step(void **state) {
    (void)state;
    pt_config c;
    tiny_config(&c, NULL);
    c.training.micro_batch = 4;
    pt_trainer a, b;
    init_or_fail(&a, &c);
    c.training.micro_batch = 1;
    init_or_fail(&b, &c);
    for (int s = 0; s < STEPS; s++) {
        pt_step_stats sa, sb;
        assert_int_equal(pt_trainer_step(&a, &sa), PT_OK);
        assert_int_equal(pt_trainer_step(&b, &sb), PT_OK);
        double rel = fabs(sa.loss - sb.loss) / sa.loss;
        if (rel > 1e-5) fail_msg("step %d: loss %.9g (mb 4) vs %.9g (mb 1)", s + 1, sa.loss, sb.loss);
    }
    float *pa = tu_download(a.be, a.model.params, a.model.table.total);
    float *pb = tu_download(b.be, b.model.params, b.model.table.total);
    tu_check_rel("weights after accumulation", tu_rel_err(pb, pa, a.model.table.total), 1e-5);
    free(pa), free(pb);
    pt_trainer_free(&a);
    pt_trainer_free(&b);
}

static void flip_byte(const char *path, long where) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, where, where < 0 ? SEEK_END : SEEK_SET);
    int ch = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(ch ^ 0x5a, f);
    fclose(f);
}

static void test_checkpoint_corruption_is_detected(void **state) {
    (void)state;
    char dir[600], ck[700], path[800], cmd[4000];
    snprintf(dir, sizeof dir, "%s/corrupt", tu_tmpdir());
    pt_config c;
    tiny_config(&c, dir);
    pt_trainer t;
    init_or_fail(&t, &c);
    pt_step_stats st;
    assert_int_equal(pt_trainer_step(&t, &st), PT_OK);
    assert_int_equal(save_as(&t, dir, 1, 3), PT_OK);
    snprintf(ck, sizeof ck, "%s/step_00000001", dir);
    int64_t step;

    /* a flipped byte in the shard's data */
    snprintf(cmd, sizeof cmd, "cp -r %s %s.bak", ck, ck);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/shard-00000-of-00001.safetensors", ck);
    flip_byte(path, -3);
    assert_int_not_equal(load_state(&t, ck, &step), PT_OK);
    assert_non_null(strstr(pt_last_error(), "checksum"));
    assert_non_null(strstr(pt_last_error(), "shard-00000-of-00001.safetensors"));

    /* a truncated shard */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s.bak %s && truncate -s 1000 %s/shard-00000-of-00001.safetensors",
             ck, ck, ck, ck);
    assert_int_equal(system(cmd), 0);
    assert_int_not_equal(load_state(&t, ck, &step), PT_OK);
    assert_non_null(strstr(pt_last_error(), "shard-00000-of-00001.safetensors"));

    /* an index whose tensors are not this model's */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s.bak %s && sed -i 's/model.norm.weight/model.nrm.weight/' %s/index.json",
             ck, ck, ck, ck);
    assert_int_equal(system(cmd), 0);
    assert_int_not_equal(load_state(&t, ck, &step), PT_OK);
    assert_non_null(strstr(pt_last_error(), "model.norm.weight"));

    /* an index whose ranges leave a gap */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s.bak %s && sed -i '0,/^     0,$/s//     5,/' %s/index.json",
             ck, ck, ck, ck);
    assert_int_equal(system(cmd), 0);
    assert_int_not_equal(load_state(&t, ck, &step), PT_OK);
    assert_non_null(strstr(pt_last_error(), "do not cover the model"));

    /* the intact copy loads */
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s.bak %s", ck, ck, ck);
    assert_int_equal(system(cmd), 0);
    if (load_state(&t, ck, &step) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(step, 1);
    pt_trainer_free(&t);
}

static void test_rotation_and_interrupted_save(void **state) {
    (void)state;
    char dir[600], path[800], latest[800];
    snprintf(dir, sizeof dir, "%s/rotate", tu_tmpdir());
    pt_config c;
    tiny_config(&c, dir);
    pt_trainer t;
    init_or_fail(&t, &c);
    for (int s = 1; s <= 4; s++) assert_int_equal(save_as(&t, dir, s, 2), PT_OK);
    struct stat sb;
    for (int s = 1; s <= 4; s++) {
        snprintf(path, sizeof path, "%s/step_%08d", dir, s);
        assert_int_equal(stat(path, &sb) == 0, s >= 3);
    }
    /* a save that died half-way leaves a .tmp directory: it is never taken as a checkpoint */
    snprintf(path, sizeof path, "%s/step_00000009.tmp", dir);
    assert_int_equal(pt_mkdirs(path), PT_OK);
    assert_int_equal(pt_ckpt_find_latest(dir, latest, sizeof latest), PT_OK);
    assert_non_null(strstr(latest, "step_00000004"));
    /* and the next save of that step replaces it */
    assert_int_equal(save_as(&t, dir, 9, 2), PT_OK);
    assert_int_equal(stat(path, &sb) == 0, 0);
    assert_int_equal(pt_ckpt_find_latest(dir, latest, sizeof latest), PT_OK);
    assert_non_null(strstr(latest, "step_00000009"));
    pt_trainer_free(&t);
}

static void test_init_from_export_reproduces_the_model(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/export", tu_tmpdir());
    pt_config c;
    tiny_config(&c, NULL);
    pt_trainer a;
    init_or_fail(&a, &c);
    pt_step_stats st;
    assert_int_equal(pt_trainer_step(&a, &st), PT_OK);
    assert_int_equal(pt_ckpt_export_hf(dir, &a.model), PT_OK);
    pt_config d;
    tiny_config(&d, NULL);
    snprintf(d.init_from, sizeof d.init_from, "%s", dir);
    /* model.dim is explicit here (tiny_config gives it): an architecture key that contradicts
     * config.json is refused, naming both values; one that agrees is fine */
    d.model.dim = 999;
    pt_trainer b;
    assert_int_equal(pt_trainer_init(&b, &d), PT_ERR_CONFIG);
    assert_non_null(strstr(pt_last_error(), "model.dim = 999 (explicit) contradicts the "
                                            "checkpoint's 32"));
    d.model.dim = 32;
    init_or_fail(&b, &d);
    assert_int_equal(b.model.cfg.dim, 32);
    float *pa = tu_download(a.be, a.model.params, a.model.table.total);
    float *pb = tu_download(b.be, b.model.params, b.model.table.total);
    assert_memory_equal(pb, pa, a.model.table.total * sizeof(float));
    free(pa), free(pb);
    pt_trainer_free(&a);
    pt_trainer_free(&b);
}

static void test_init_from_bf16_weights(void **state) {
    (void)state;
    /* a Hugging Face directory with BF16 weights: loaded and widened to fp32 exactly */
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/bf16", tu_tmpdir());
    pt_config c;
    tiny_config(&c, NULL);
    pt_trainer a;
    init_or_fail(&a, &c);
    assert_int_equal(pt_ckpt_export_hf(dir, &a.model), PT_OK);
    pt_st_writer *w = pt_st_writer_create();
    float *pa = tu_download(a.be, a.model.params, a.model.table.total);
    for (int i = 0; i < a.model.table.n; i++) {
        const pt_param *p = &a.model.table.p[i];
        assert_int_equal(pt_st_writer_add_f32(w, p->name, p->shape, p->ndim, pa + p->offset,
                                              PT_ST_DTYPE_BF16),
                         PT_OK);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    pt_config d;
    tiny_config(&d, NULL);
    snprintf(d.init_from, sizeof d.init_from, "%s", dir);
    pt_trainer b;
    init_or_fail(&b, &d);
    float *pb = tu_download(b.be, b.model.params, b.model.table.total);
    for (size_t i = 0; i < a.model.table.total; i++) {
        float want = pt_bf16_to_f32(pt_f32_to_bf16(pa[i]));
        if (pb[i] != want)
            fail_msg("element %zu: %.9g loaded, %.9g expected (bf16 of %.9g)", i, pb[i], want, pa[i]);
    }
    free(pa), free(pb);
    pt_step_stats st;
    assert_int_equal(pt_trainer_step(&b, &st), PT_OK);
    pt_trainer_free(&a);
    pt_trainer_free(&b);
}

static void test_export_reads_back_in_a_hugging_face_style_reader(void **state) {
    (void)state;
    /* the exported directory, read by names and config.json keys as transformers reads them, and
     * run by the PyTorch reference model, gives pentatron's logits: Llama untied and tied; a
     * Mixtral-shaped mixture of experts as MixtralForCausalLM, run by hf_eval.py's Mixtral
     * (written from transformers' modelling code, not from pentatron's MoE); a MoE with a shared
     * expert as PentatronMoeForCausalLM, which that reader refuses (no architecture of
     * transformers computes it); attention biases: Llama's attention_bias (q, k, v, o) as
     * LlamaForCausalLM, q, k and v's as Qwen2ForCausalLM (run with Qwen 2's biases) */
    for (int k = 0; k < 6; k++) {
        int tied = k == 1, moe = k == 2 || k == 3, shared = k == 3;
        int bias = k == 4, qwen = k == 5;
        char dir[600], tok_path[700], out[700], cmd[3000];
        snprintf(dir, sizeof dir, "%s/hf_%d", tu_tmpdir(), k);
        pt_config c;
        tiny_config(&c, NULL);
        c.model.tied_embeddings = tied;
        c.model.attention_bias = bias, c.model.qkv_bias = qwen;
        if (moe) {
            c.model.n_experts = 4, c.model.top_k = 2, c.model.moe_ffn_dim = 24;
            c.model.n_shared_experts = shared, c.model.aux_loss_coef = 0.01f;
        }
        pt_trainer t;
        init_or_fail(&t, &c);
        pt_step_stats st;
        assert_int_equal(pt_trainer_step(&t, &st), PT_OK); /* trained weights, not the init */
        assert_int_equal(pt_ckpt_export_hf(dir, &t.model), PT_OK);
        int B = 2, T = 11, V = c.model.vocab_size;
        int32_t tokens[22], pos[11];
        for (int i = 0; i < B * T; i++) tokens[i] = (i * 37 + 5) % V;
        for (int i = 0; i < T; i++) pos[i] = i;
        snprintf(tok_path, sizeof tok_path, "%s/tokens.json", dir);
        FILE *f = fopen(tok_path, "w");
        fprintf(f, "[");
        for (int b = 0; b < B; b++) {
            fprintf(f, "%s[", b ? "," : "");
            for (int i = 0; i < T; i++) fprintf(f, "%s%d", i ? "," : "", tokens[b * T + i]);
            fprintf(f, "]");
        }
        fprintf(f, "]\n");
        fclose(f);
        snprintf(out, sizeof out, "%s/logits.safetensors", dir);
        snprintf(cmd, sizeof cmd, "%s %s/tests/ref/hf_eval.py %s %s %s",
                 tu_env("PT_PYTHON") ? tu_env("PT_PYTHON") : "/usr/bin/python3",
                 tu_env("PT_SOURCE_DIR"), dir, tok_path, out);
        char cfg_path[700];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        char *json;
        size_t json_len;
        assert_int_equal(pt_read_file(cfg_path, &json, &json_len), PT_OK);
        const char *arch = qwen    ? "\"Qwen2ForCausalLM\""
                           : !moe  ? "\"LlamaForCausalLM\""
                           : shared ? "\"PentatronMoeForCausalLM\""
                                    : "\"MixtralForCausalLM\"";
        if (!strstr(json, arch)) fail_msg("export %d: config.json does not name %s:\n%s", k, arch, json);
        if (bias && !strstr(json, "\"attention_bias\": true"))
            fail_msg("export %d: config.json lacks attention_bias true:\n%s", k, json);
        free(json);
        if (shared) { /* the reader refuses what transformers does not implement */
            if (system(cmd) == 0) fail_msg("the reader ran PentatronMoeForCausalLM: %s", cmd);
            pt_trainer_free(&t);
            continue;
        }
        if (system(cmd) != 0) fail_msg("reader failed: %s", cmd);
        pt_acts *a = pt_acts_create(&t.model, B, T);
        float *got = malloc((size_t)B * T * V * sizeof(float)), *want = malloc((size_t)B * T * V * sizeof(float));
        pt_model_logits(&t.model, a, tokens, pos, got);
        pt_st_file *sf;
        assert_int_equal(pt_st_open(&sf, out), PT_OK);
        int64_t shape[3] = {B, T, V};
        assert_int_equal(pt_st_read_f32(sf, "logits", shape, 3, want), PT_OK);
        tu_check_rel(moe ? "Mixtral export logits" : tied ? "tied export logits"
                     : bias ? "Llama attention_bias export logits" : qwen ? "Qwen 2 export logits"
                     : "untied export logits",
                     tu_rel_err(got, want, (size_t)B * T * V), 1e-5);
        pt_st_close(sf);
        free(got);
        free(want);
        pt_acts_free(&t.model, a);
        pt_trainer_free(&t);
    }
}

/* A checkpoint whose weights or moments are not finite is never published: the save fails
 * naming the tensor and the newest checkpoint stays the last good one; loading refuses the
 * weights of a Hugging Face directory that holds one, naming the tensor. */
static void test_nonfinite_checkpoint_not_published(void **state) {
    (void)state;
    char dir[600], hf[600];
    snprintf(dir, sizeof dir, "%s/nonfinite", tu_tmpdir());
    snprintf(hf, sizeof hf, "%s/nonfinite_hf", tu_tmpdir());
    pt_config c;
    tiny_config(&c, dir);
    pt_trainer t;
    init_or_fail(&t, &c);
    pt_step_stats st;
    assert_int_equal(pt_trainer_step(&t, &st), PT_OK);
    assert_int_equal(pt_trainer_save(&t), PT_OK);
    float *host = malloc(t.model.gtable.total * sizeof(float));
    pt_trainer_get_params(&t, host);
    const pt_param *p = &t.model.gtable.p[3]; /* a weight matrix of layer 0 */
    host[p->offset + 5] = NAN;
    pt_trainer_set_params(&t, host);
    if (save_as(&t, dir, 2, 3) == PT_OK) fail_msg("a checkpoint with a NaN weight was published");
    if (!strstr(pt_last_error(), "not finite") || !strstr(pt_last_error(), p->name))
        fail_msg("the refusal does not name %s: %s", p->name, pt_last_error());
    char latest[700];
    assert_int_equal(pt_ckpt_find_latest(dir, latest, sizeof latest), PT_OK);
    if (!strstr(latest, "step_00000001")) fail_msg("the newest checkpoint is %s, not step 1", latest);
    /* an exported directory holding the NaN: its weights are refused on loading */
    assert_int_equal(pt_ckpt_export_hf_host(hf, &t.model, host, PT_ST_DTYPE_F32), PT_OK);
    float *back = malloc(t.model.gtable.total * sizeof(float));
    if (pt_ckpt_load_weights_host(hf, &t.model, back) == PT_OK)
        fail_msg("weights holding a NaN were loaded");
    if (!strstr(pt_last_error(), p->name)) fail_msg("the refusal does not name %s: %s", p->name, pt_last_error());
    free(back);
    free(host);
    pt_trainer_free(&t);
}

static void test_lr_schedule(void **state) {
    (void)state;
    pt_optim_config c = {.lr = 1.0f, .warmup_steps = 4, .total_steps = 14, .min_lr = 0.1f,
                         .schedule = PT_LR_COSINE};
    assert_float_equal(pt_lr_at(&c, 0), 0.25f, 1e-7);
    assert_float_equal(pt_lr_at(&c, 3), 1.0f, 1e-7);
    assert_float_equal(pt_lr_at(&c, 4), 1.0f, 1e-7);
    assert_float_equal(pt_lr_at(&c, 9), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.5)), 1e-6);
    assert_float_equal(pt_lr_at(&c, 14), 0.1f, 1e-6);
    assert_float_equal(pt_lr_at(&c, 100), 0.1f, 1e-6);
    c.schedule = PT_LR_LINEAR;
    assert_float_equal(pt_lr_at(&c, 9), 0.1 + 0.9 * 0.5, 1e-6);
    c.schedule = PT_LR_CONSTANT;
    assert_float_equal(pt_lr_at(&c, 9), 1.0f, 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_is_bitwise),
        cmocka_unit_test(test_accumulation_does_not_change_the_step),
        cmocka_unit_test(test_checkpoint_corruption_is_detected),
        cmocka_unit_test(test_rotation_and_interrupted_save),
        cmocka_unit_test(test_init_from_export_reproduces_the_model),
        cmocka_unit_test(test_init_from_bf16_weights),
        cmocka_unit_test(test_export_reads_back_in_a_hugging_face_style_reader),
        cmocka_unit_test(test_nonfinite_checkpoint_not_published),
        cmocka_unit_test(test_lr_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
