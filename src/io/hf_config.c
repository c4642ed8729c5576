/* hf_config.c: Hugging Face LlamaForCausalLM config.json reading (validated key by key) and
 * writing (see include/pt/hf_config.h for the key table). */
#include "pt/hf_config.h"

#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The value of `key`, or NULL when it is absent or null (transformers writes None as null). */
static json_t *value_of(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_null(v) ? NULL : v;
}

static pt_status get_int(const char *path, json_t *root, const char *key, int required, int def,
                         int *out) {
    json_t *v = value_of(root, key);
    if (!v) {
        if (required)
            return pt_errorf(PT_ERR_CONFIG, "%s: missing key \"%s\" (expected a positive integer)",
                             path, key);
        *out = def;
        return PT_OK;
    }
    if (!json_is_integer(v))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < 1 || x > INT_MAX)
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"%s\" = %lld, expected an integer in [1, %d]",
                         path, key, (long long)x, INT_MAX);
    *out = (int)x;
    return PT_OK;
}

static pt_status get_float(const char *path, json_t *root, const char *key, float def, float *out) {
    json_t *v = value_of(root, key);
    if (!v) {
        *out = def;
        return PT_OK;
    }
    if (!json_is_number(v))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"%s\" must be a number", path, key);
    double x = json_number_value(v);
    if (!(x > 0) || x > FLT_MAX)
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"%s\" = %g, expected a positive float32", path,
                         key, x);
    *out = (float)x;
    return PT_OK;
}

static pt_status get_bool(const char *path, json_t *root, const char *key, int def, int *out) {
    json_t *v = value_of(root, key);
    if (!v) {
        *out = def;
        return PT_OK;
    }
    if (!json_is_boolean(v))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"%s\" must be true or false", path, key);
    *out = json_is_true(v);
    return PT_OK;
}

/* model_type and architectures: at least one present, each that is present says Llama (or
 * Mixtral, Llama's mixture-of-experts sibling). */
static pt_status check_model_kind(const char *path, json_t *root) {
    json_t *mt = value_of(root, "model_type"), *arch = value_of(root, "architectures");
    if (!mt && !arch)
        return pt_errorf(PT_ERR_CONFIG,
                         "%s: neither \"model_type\" nor \"architectures\" is present "
                         "(expected \"llama\" / [\"LlamaForCausalLM\"])",
                         path);
    if (mt && (!json_is_string(mt) || (strcmp(json_string_value(mt), "llama") != 0 &&
                                       strcmp(json_string_value(mt), "mixtral") != 0 &&
                                       strcmp(json_string_value(mt), "qwen2") != 0 &&
                                       strcmp(json_string_value(mt), "pentatron_moe") != 0)))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"model_type\" must be \"llama\", \"mixtral\", "
                         "\"qwen2\" or \"pentatron_moe\"", path);
    if (arch) {
        int found = 0;
        size_t i;
        json_t *a;
        if (!json_is_array(arch))
            return pt_errorf(PT_ERR_CONFIG, "%s: key \"architectures\" must be an array of strings",
                             path);
        json_array_foreach(arch, i, a) {
            if (!json_is_string(a))
                return pt_errorf(PT_ERR_CONFIG,
                                 "%s: key \"architectures\" must be an array of strings", path);
            found |= strcmp(json_string_value(a), "LlamaForCausalLM") == 0 ||
                     strcmp(json_string_value(a), "MixtralForCausalLM") == 0 ||
                     strcmp(json_string_value(a), "Qwen2ForCausalLM") == 0 ||
                     strcmp(json_string_value(a), "PentatronMoeForCausalLM") == 0;
        }
        if (!found)
            return pt_errorf(PT_ERR_CONFIG,
                             "%s: key \"architectures\" lists none of \"LlamaForCausalLM\", "
                             "\"MixtralForCausalLM\", \"Qwen2ForCausalLM\", "
                             "\"PentatronMoeForCausalLM\"", path);
    }
    return PT_OK;
}

/* Whether config.json describes Qwen 2 (model_type or architectures): biases on q, k, v. */
static int is_qwen2(json_t *root) {
    json_t *mt = value_of(root, "model_type"), *arch = value_of(root, "architectures"), *a;
    if (mt && json_is_string(mt) && !strcmp(json_string_value(mt), "qwen2")) return 1;
    size_t i;
    if (arch && json_is_array(arch))
        json_array_foreach(arch, i, a) {
            if (json_is_string(a) && !strcmp(json_string_value(a), "Qwen2ForCausalLM")) return 1;
        }
    return 0;
}

/* Features transformers' Llama (Qwen 2) supports and this trainer does not: refuse rather than
 * differ. */
static pt_status check_unsupported(const char *path, json_t *root, const pt_model_config *c) {
    (void)c;
    json_t *v = value_of(root, "hidden_act");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "silu") != 0))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"hidden_act\" must be \"silu\"", path);
    v = value_of(root, "mlp_bias");
    if (v && !json_is_false(v))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"mlp_bias\" must be false (MLP biases not "
                         "supported)", path);
    v = value_of(root, "use_sliding_window");
    if (v && !json_is_false(v))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"use_sliding_window\" must be false (sliding-"
                         "window attention not supported)", path);
    v = value_of(root, "attention_dropout");
    if (v && (!json_is_number(v) || json_number_value(v) != 0))
        return pt_errorf(PT_ERR_CONFIG,
                         "%s: key \"attention_dropout\" must be 0 (dropout not supported)", path);
    return PT_OK;
}

/* rope_scaling: null, or Llama 3.1's {"rope_type" (or "type"): "llama3", "factor",
 * "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}; any other type is
 * refused by name. */
static pt_status parse_rope_scaling(const char *path, json_t *root, pt_model_config *c) {
    json_t *rs = value_of(root, "rope_scaling");
    if (!rs) return PT_OK;
    if (!json_is_object(rs))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"rope_scaling\" must be null or an object", path);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = t && json_is_string(t) ? json_string_value(t) : NULL;
    if (!type || strcmp(type, "llama3") != 0)
        return pt_errorf(PT_ERR_CONFIG, "%s: rope_scaling of type \"%s\" not supported (only "
                         "\"llama3\")", path, type ? type : "(none)");
    const struct {
        const char *key;
        float *dst;
    } reals[] = {{"factor", &c->rope_factor},
                 {"low_freq_factor", &c->rope_low_freq_factor},
                 {"high_freq_factor", &c->rope_high_freq_factor}};
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) {
        json_t *v = json_object_get(rs, reals[i].key);
        if (!v || !json_is_number(v) || !(json_number_value(v) > 0))
            return pt_errorf(PT_ERR_CONFIG, "%s: rope_scaling \"%s\" must be a positive number",
                             path, reals[i].key);
        *reals[i].dst = (float)json_number_value(v);
    }
    json_t *om = json_object_get(rs, "original_max_position_embeddings");
    if (!om || !json_is_integer(om) || json_integer_value(om) < 1)
        return pt_errorf(PT_ERR_CONFIG, "%s: rope_scaling \"original_max_position_embeddings\" "
                         "must be a positive integer", path);
    c->rope_original_max_seq_len = (int)json_integer_value(om);
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return pt_errorf(PT_ERR_CONFIG, "%s: rope_scaling \"high_freq_factor\" (%g) must exceed "
                         "\"low_freq_factor\" (%g)", path, c->rope_high_freq_factor,
                         c->rope_low_freq_factor);
    return PT_OK;
}

static pt_status parse(const char *path, json_t *root, pt_model_config *c) {
    PT_TRY(check_model_kind(path, root));
    PT_TRY(get_int(path, root, "vocab_size", 1, 0, &c->vocab_size));
    PT_TRY(get_int(path, root, "hidden_size", 1, 0, &c->dim));
    PT_TRY(get_int(path, root, "num_hidden_layers", 1, 0, &c->n_layers));
    PT_TRY(get_int(path, root, "num_attention_heads", 1, 0, &c->n_heads));
    PT_TRY(get_int(path, root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads));
    PT_TRY(get_int(path, root, "intermediate_size", 1, 0, &c->ffn_dim));
    PT_TRY(get_int(path, root, "max_position_embeddings", 1, 0, &c->max_seq_len));
    PT_TRY(get_float(path, root, "rope_theta", 10000.0f, &c->rope_theta));
    /* head_dim: absent or null means hidden_size / num_attention_heads */
    json_t *hd = value_of(root, "head_dim");
    if (hd && (!json_is_integer(hd) || json_integer_value(hd) < 2 || json_integer_value(hd) % 2))
        return pt_errorf(PT_ERR_CONFIG, "%s: key \"head_dim\" must be an even integer >= 2", path);
    c->head_dim = hd ? (int)json_integer_value(hd) : 0;
    c->rope_low_freq_factor = 1.0f, c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_seq_len = 8192;
    PT_TRY(parse_rope_scaling(path, root, c));
    PT_TRY(get_float(path, root, "rms_norm_eps", 1e-6f, &c->norm_eps));
    PT_TRY(get_bool(path, root, "tie_word_embeddings", 0, &c->tied_embeddings));
    /* biases: Llama's attention_bias (q, k, v, o), Qwen 2's on q, k, v (no key: always) */
    PT_TRY(get_bool(path, root, "attention_bias", 0, &c->attention_bias));
    c->qkv_bias = is_qwen2(root);
    if (c->qkv_bias && c->attention_bias)
        return pt_errorf(PT_ERR_CONFIG, "%s: a Qwen 2 config with \"attention_bias\" true (Qwen 2 "
                         "has biases on q, k and v only)", path);
    PT_TRY(get_float(path, root, "initializer_range", 0.02f, &c->init_std));
    /* mixture of experts (Mixtral names; the rest as DeepSeek's configs call them) */
    PT_TRY(get_int(path, root, "num_local_experts", 0, 0, &c->n_experts));
    PT_TRY(get_int(path, root, "num_experts_per_tok", 0, 2, &c->top_k));
    PT_TRY(get_int(path, root, "moe_intermediate_size", 0, c->ffn_dim, &c->moe_ffn_dim));
    PT_TRY(get_int(path, root, "moe_layer_freq", 0, 1, &c->moe_every));
    c->moe_first_dense = 0;
    c->n_shared_experts = 0;
    json_t *fd = value_of(root, "first_k_dense_replace"), *ns = value_of(root, "n_shared_experts");
    if (fd && json_is_integer(fd)) c->moe_first_dense = (int)json_integer_value(fd);
    if (ns && json_is_integer(ns)) c->n_shared_experts = (int)json_integer_value(ns);
    json_t *ac = value_of(root, "router_aux_loss_coef"), *zc = value_of(root, "router_z_loss_coef");
    c->aux_loss_coef = ac && json_is_number(ac) ? (float)json_number_value(ac) : 0.0f;
    c->z_loss_coef = zc && json_is_number(zc) ? (float)json_number_value(zc) : 0.0f;
    json_t *sf = value_of(root, "scoring_func"), *br = value_of(root, "bias_update_rate");
    c->router_sigmoid = sf && json_is_string(sf) && !strcmp(json_string_value(sf), "sigmoid");
    c->bias_rate = br && json_is_number(br) ? (float)json_number_value(br) : 0.0f;
    json_t *cf = value_of(root, "capacity_factor");
    c->capacity_factor = cf && json_is_number(cf) ? (float)json_number_value(cf) : 0.0f;
    if (c->head_dim == 0 && c->dim % c->n_heads != 0)
        return pt_errorf(
            PT_ERR_CONFIG,
            "%s: key \"hidden_size\" = %d is not a multiple of num_attention_heads = %d (and no "
            "head_dim)", path, c->dim, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return pt_errorf(
            PT_ERR_CONFIG,
            "%s: key \"num_key_value_heads\" = %d does not divide num_attention_heads = %d", path,
            c->n_kv_heads, c->n_heads);
    return check_unsupported(path, root, c);
}

pt_status pt_hf_config_read(const char *path, pt_model_config *out) {
    char *text;
    size_t len;
    PT_TRY(pt_read_file(path, &text, &len));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s: not valid JSON (line %d, column %d: %s)", path,
                         err.line, err.column, err.text);
    pt_status st;
    pt_model_config c = {0};
    if (!json_is_object(root))
        st = pt_errorf(PT_ERR_FORMAT, "%s: expected a JSON object", path);
    else
        st = parse(path, root, &c);
    json_decref(root);
    if (st == PT_OK) *out = c;
    return st;
}

/* The fewest significant digits that read back (through double, as readers do) to x. */
static json_t *short_real(float x) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        if ((float)strtod(buf, NULL) == x) break;
    }
    return json_real(strtod(buf, NULL));
}

static void set_key(json_t *root, const char *key, json_t *value) {
    PT_ASSERT(value && json_object_set_new(root, key, value) == 0);
}

static pt_status check_for_write(const char *path, const pt_model_config *c) {
    const struct {
        const char *key;
        int v;
    } ints[] = {{"vocab_size", c->vocab_size},
                {"hidden_size", c->dim},
                {"num_hidden_layers", c->n_layers},
                {"num_attention_heads", c->n_heads},
                {"num_key_value_heads", c->n_kv_heads},
                {"intermediate_size", c->ffn_dim},
                {"max_position_embeddings", c->max_seq_len}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].v < 1)
            return pt_errorf(PT_ERR_CONFIG,
                             "%s: cannot write %s = %d (expected a positive integer)", path,
                             ints[i].key, ints[i].v);
    const struct {
        const char *key;
        float v;
    } reals[] = {{"rope_theta", c->rope_theta},
                 {"rms_norm_eps", c->norm_eps},
                 {"initializer_range", c->init_std}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (!(reals[i].v > 0) || !isfinite(reals[i].v))
            return pt_errorf(PT_ERR_CONFIG,
                             "%s: cannot write %s = %g (expected a positive finite number)", path,
                             reals[i].key, (double)reals[i].v);
    if ((c->head_dim == 0 && c->dim % c->n_heads != 0) || c->n_heads % c->n_kv_heads != 0)
        return pt_errorf(
            PT_ERR_CONFIG,
            "%s: cannot write hidden_size %d, num_attention_heads %d, num_key_value_heads %d "
            "(expected hidden_size divisible by heads or a head_dim, heads by kv heads)",
            path, c->dim, c->n_heads, c->n_kv_heads);
    return PT_OK;
}

const char *pt_hf_unmapped_reason(const pt_model_config *c) {
    if (c->n_experts == 0) return NULL;
    if (pt_model_qkv_bias(c))
        return "attention biases (Mixtral's attention has none)";
    if (c->n_shared_experts > 0)
        return "shared experts (no architecture in transformers adds an ungated shared expert to "
               "Mixtral's routing and Llama's attention)";
    if (c->moe_first_dense > 0 || c->moe_every > 1)
        return "dense layers among the MoE ones (Mixtral's layers are all MoE)";
    if (c->router_sigmoid)
        return "the sigmoid router with its selection bias (DeepSeek-V3's, whose attention is not "
               "Llama's)";
    return NULL;
}

pt_status pt_hf_config_write(const char *path, const pt_model_config *c) {
    PT_TRY(check_for_write(path, c));
    json_t *root = json_object();
    PT_ASSERT(root);
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    set_key(root, "architectures", arch);
    set_key(root, "attention_bias", json_boolean(c->attention_bias));
    set_key(root, "attention_dropout", json_real(0.0));
    /* GPT-2's <|endoftext|> id, the tokenizer pentatron trains with, when the vocabulary has it */
    set_key(root, "bos_token_id", c->vocab_size > 50256 ? json_integer(50256) : json_null());
    set_key(root, "eos_token_id", c->vocab_size > 50256 ? json_integer(50256) : json_null());
    set_key(root, "head_dim", json_integer(pt_model_head_dim(c)));
    set_key(root, "hidden_act", json_string("silu"));
    set_key(root, "hidden_size", json_integer(c->dim));
    set_key(root, "initializer_range", short_real(c->init_std));
    set_key(root, "intermediate_size", json_integer(c->ffn_dim));
    set_key(root, "max_position_embeddings", json_integer(c->max_seq_len));
    set_key(root, "mlp_bias", json_false());
    set_key(root, "model_type", json_string("llama"));
    set_key(root, "num_attention_heads", json_integer(c->n_heads));
    set_key(root, "num_hidden_layers", json_integer(c->n_layers));
    set_key(root, "num_key_value_heads", json_integer(c->n_kv_heads));
    set_key(root, "pretraining_tp", json_integer(1));
    set_key(root, "rms_norm_eps", short_real(c->norm_eps));
    if (c->rope_factor > 0) {
        json_t *rs = json_object();
        PT_ASSERT(rs);
        set_key(rs, "rope_type", json_string("llama3"));
        set_key(rs, "factor", short_real(c->rope_factor));
        set_key(rs, "low_freq_factor", short_real(c->rope_low_freq_factor));
        set_key(rs, "high_freq_factor", short_real(c->rope_high_freq_factor));
        set_key(rs, "original_max_position_embeddings", json_integer(c->rope_original_max_seq_len));
        set_key(root, "rope_scaling", rs);
    } else {
        set_key(root, "rope_scaling", json_null());
    }
    set_key(root, "rope_theta", short_real(c->rope_theta));
    set_key(root, "tie_word_embeddings", json_boolean(c->tied_embeddings));
    set_key(root, "torch_dtype", json_string("float32"));
    if (c->qkv_bias && !c->attention_bias && c->n_experts == 0) {
        /* biases on q, k and v only: Qwen 2 computes exactly this (Llama's attention_bias adds
         * o's too) */
        json_array_set_new(arch, 0, json_string("Qwen2ForCausalLM"));
        set_key(root, "model_type", json_string("qwen2"));
        json_object_del(root, "attention_bias");
        json_object_del(root, "mlp_bias");
        set_key(root, "use_sliding_window", json_false());
        set_key(root, "sliding_window", json_null());
        set_key(root, "max_window_layers", json_integer(c->n_layers));
    }
    if (c->n_experts > 0) {
        /* Mixtral's keys, and DeepSeek's for what Mixtral does not have; a shape Mixtral does not
         * compute goes under pentatron's own name, so that no reader takes it for Mixtral */
        int mixtral = pt_hf_unmapped_reason(c) == NULL;
        json_array_set_new(arch, 0, json_string(mixtral ? "MixtralForCausalLM" : "PentatronMoeForCausalLM"));
        set_key(root, "model_type", json_string(mixtral ? "mixtral" : "pentatron_moe"));
        set_key(root, "num_local_experts", json_integer(c->n_experts));
        set_key(root, "num_experts_per_tok", json_integer(c->top_k));
        set_key(root, "moe_intermediate_size", json_integer(c->moe_ffn_dim));
        set_key(root, "moe_layer_freq", json_integer(c->moe_every));
        set_key(root, "first_k_dense_replace", json_integer(c->moe_first_dense));
        set_key(root, "n_shared_experts", json_integer(c->n_shared_experts));
        set_key(root, "router_aux_loss_coef", short_real(c->aux_loss_coef));
        set_key(root, "router_z_loss_coef", short_real(c->z_loss_coef));
        set_key(root, "capacity_factor", short_real(c->capacity_factor));
        set_key(root, "scoring_func", json_string(c->router_sigmoid ? "sigmoid" : "softmax"));
        set_key(root, "bias_update_rate", short_real(c->bias_rate));
    }
    set_key(root, "use_cache", json_true());
    set_key(root, "vocab_size", json_integer(c->vocab_size));
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(root);
    PT_ASSERT(s);
    size_t n = strlen(s);
    char *text = pt_malloc(n + 2);
    memcpy(text, s, n);
    text[n] = '\n';
    text[n + 1] = '\0';
    free(s);
    pt_status st = pt_write_file_atomic(path, text, n + 1);
    free(text);
    return st;
}
