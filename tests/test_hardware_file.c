/* test_hardware_file.c: the hardware files of `pentatron plan` (src/plan/hardware.c): the shipped
 * hardware/ files against their datasheets' figures (written here again, independently), overrides,
 * a written file reading back the same, and each kind of bad file or override refused with one
 * message naming the file and the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/plan.h"
#include "testutil.h"

static const char *write_ini(const char *name, const char *text) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    tu_write_file(path, text, strlen(text));
    return path;
}

static void load_shipped(pt_hardware *hw, const char *file, const char *const *ov, int n) {
    const char *src = tu_env("PT_SOURCE_DIR");
    assert_non_null(src);
    char path[1024];
    snprintf(path, sizeof path, "%s/hardware/%s", src, file);
    pt_status st = pt_hardware_load(hw, path, ov, n);
    if (st != PT_OK) fail_msg("%s: %s", file, pt_last_error());
}

static void near(const char *what, double got, double want) {
    if (fabs(got - want) > 1e-9 * fabs(want)) fail_msg("%s: %g, expected %g", what, got, want);
}

/* What every shipped file must hold beyond its datasheet figures: a cited efficiency below 1
 * (large GEMMs never reach the datasheet peak), latencies of microseconds, and the figures of
 * published measurements (docs/plan.md, "The shipped files"): NCCL's collectives within a node
 * at its measured bus bandwidth (3 kinds, 8 ranks, 65-85% of the link), NCCL's flat rings
 * across nodes, and the 18.9% slowdown of a computation beside a transfer. */
static void plausible(const char *file, const pt_hardware *hw) {
    if (hw->n_colls != 3 || !hw->nccl || hw->overlap_slowdown != 0.189)
        fail_msg("%s: collectives %d, comm nccl %d, overlap_slowdown %g", file, hw->n_colls, hw->nccl,
                 hw->overlap_slowdown);
    for (int i = 0; i < hw->n_colls; i++) {
        const pt_coll_time *c = &hw->colls[i];
        double steps = c->kind == PT_HW_AR ? 2.0 * (c->ranks - 1) : c->ranks - 1.0;
        double busbw = steps / c->ranks * c->bytes / c->seconds;
        if (c->inter || c->ranks != 8 || !(busbw > 0.65 * hw->intra_bw && busbw < 1.1 * hw->intra_bw))
            fail_msg("%s: collective %d: %d ranks, bus bandwidth %g of the link's %g", file, i,
                     c->ranks, busbw, hw->intra_bw);
    }
    if (!(hw->gemm_efficiency > 0.3 && hw->gemm_efficiency < 1))
        fail_msg("%s: gemm_efficiency %g", file, hw->gemm_efficiency);
    if (!(hw->intra_latency >= 5e-7 && hw->intra_latency <= 5e-5) ||
        !(hw->inter_latency >= hw->intra_latency && hw->inter_latency <= 1e-4))
        fail_msg("%s: latencies %g, %g s", file, hw->intra_latency, hw->inter_latency);
    assert_true(hw->name[0] != 0);
}

static void test_shipped_files(void **state) {
    (void)state;
    pt_hardware hw;
    /* H100 SXM5: 989 TFLOPS bf16 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s both ways,
     * 400 Gb/s a GPU */
    load_shipped(&hw, "h100_sxm.ini", NULL, 0);
    assert_int_equal(hw.devices_per_node, 8);
    near("h100 peak", hw.peak_flops, 989e12), near("h100 memory", hw.memory_bytes, 80e9);
    /* memory_bw: what memory-bound kernels reach, the published triad (te42kyfo/gpu-benches):
     * H200's share of its datasheet, 3534 of 4800 GB/s, at H100's 3.35 TB/s */
    if (fabs(hw.memory_bw / (3.35e12 * 3534 / 4800) - 1) > 0.005) fail_msg("h100 bw %g", hw.memory_bw);
    near("h100 flash attention", hw.attention_flops, 335e12), near("h100 nvlink", hw.intra_bw, 450e9);
    near("h100 ib", hw.inter_bw, 400e9 / 8);
    plausible("h100_sxm.ini", &hw);
    double h100_eff = hw.gemm_efficiency;
    /* H200: H100's compute and links, 141 GB HBM3e at 4.8 TB/s */
    load_shipped(&hw, "h200.ini", NULL, 0);
    assert_int_equal(hw.devices_per_node, 8);
    near("h200 peak", hw.peak_flops, 989e12), near("h200 memory", hw.memory_bytes, 141e9);
    near("h200 bw (triad)", hw.memory_bw, 3.534e12), near("h200 nvlink", hw.intra_bw, 450e9);
    near("h200 ib", hw.inter_bw, 50e9), near("h200 efficiency", hw.gemm_efficiency, h100_eff);
    plausible("h200.ini", &hw);
    /* A100 80 GB SXM: 312 TFLOPS bf16 dense, 2,039 GB/s, NVLink 3 600 GB/s both ways, HDR 200 Gb/s */
    load_shipped(&hw, "a100_80gb.ini", NULL, 0);
    assert_int_equal(hw.devices_per_node, 8);
    near("a100 peak", hw.peak_flops, 312e12), near("a100 memory", hw.memory_bytes, 80e9);
    near("a100 bw (triad)", hw.memory_bw, 1.759e12), near("a100 nvlink", hw.intra_bw, 300e9);
    near("a100 ib", hw.inter_bw, 200e9 / 8);
    plausible("a100_80gb.ini", &hw);
    /* Selene-like: DGX A100 80 GB, 8 HDR 200 Gb/s a node, 560 nodes */
    load_shipped(&hw, "selene.ini", NULL, 0);
    assert_int_equal(hw.devices_per_node, 8);
    assert_int_equal(hw.nodes, 560);
    near("selene peak", hw.peak_flops, 312e12), near("selene ib", hw.inter_bw, 25e9);
    plausible("selene.ini", &hw);
    /* torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s (H100 PCIe's triad share, 1832 of 2000), 500 W
     * (Llama 3 8B's throughput at 500 W over 700 W, 27705 / 30271, on H100 SXM's 0.80) */
    load_shipped(&hw, "h100_torchtitan.ini", NULL, 0);
    near("torchtitan memory", hw.memory_bytes, 96e9);
    if (fabs(hw.memory_bw / (2.4e12 * 1832 / 2000) - 1) > 0.005) fail_msg("torchtitan bw %g", hw.memory_bw);
    if (fabs(hw.gemm_efficiency / (0.80 * 27705 / 30271) - 1) > 0.005 ||
        fabs(hw.attention_flops / (335e12 * 27705 / 30271) - 1) > 0.005)
        fail_msg("torchtitan at 500 W: efficiency %g, attention %g", hw.gemm_efficiency, hw.attention_flops);
    plausible("h100_torchtitan.ini", &hw);
    /* overrides after the file: with or without the leading dashes */
    const char *ov[] = {"--hardware.nodes=4", "hardware.gemm_efficiency=0.5"};
    load_shipped(&hw, "h100_sxm.ini", ov, 2);
    assert_int_equal(hw.nodes, 4);
    near("overridden efficiency", hw.gemm_efficiency, 0.5);
}

static const char *good =
    "[hardware]\nname = \"test box\"\ndevices_per_node = 2\nnodes = 3\npeak_flops = 1e12\n"
    "memory_bytes = 8e9 ; inline comment\nmemory_bw = 1e10\nintra_bw = 5e9\n"
    "intra_latency = 1e-6\ninter_bw = 1e9\ninter_latency = 2e-5\n";

/* The file good with `extra` appended, or with the line starting `drop` taken out. */
static pt_status load_variant(const char *name, const char *drop, const char *extra) {
    char text[4096] = "";
    const char *p = good;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = (size_t)(nl - p) + 1;
        if (!drop || strncmp(p, drop, strlen(drop))) strncat(text, p, n);
        p += n;
    }
    if (extra) strcat(text, extra);
    pt_hardware hw;
    return pt_hardware_load(&hw, write_ini(name, text), NULL, 0);
}

static void expect_error(pt_status st, const char *what, const char *needle1, const char *needle2) {
    if (st == PT_OK) fail_msg("%s: accepted", what);
    assert_int_equal(st, PT_ERR_CONFIG);
    if (!strstr(pt_last_error(), needle1) || (needle2 && !strstr(pt_last_error(), needle2)))
        fail_msg("%s: \"%s\" does not mention \"%s\"%s%s", what, pt_last_error(), needle1,
                 needle2 ? " and " : "", needle2 ? needle2 : "");
}

static void test_defaults_and_shapes(void **state) {
    (void)state;
    pt_hardware hw;
    assert_int_equal(load_variant("good.ini", NULL, NULL), PT_OK);
    assert_int_equal(pt_hardware_load(&hw, write_ini("good.ini", good), NULL, 0), PT_OK);
    assert_string_equal(hw.name, "test box");
    assert_int_equal(hw.nodes, 3);
    near("memory_bytes (inline comment)", hw.memory_bytes, 8e9);
    near("default gemm_efficiency", hw.gemm_efficiency, 1.0);
    assert_int_equal(hw.n_shapes, 0);
    /* gemm_shapes over continuation lines, quoted, a trailing ';' */
    char text[4096];
    snprintf(text, sizeof text, "%sgemm_shapes = \"64,128,256,1.5e9; 1024,1024,1024,2e11;\n"
             "    4096,64,8,3e10\"\n", good);
    assert_int_equal(pt_hardware_load(&hw, write_ini("shapes.ini", text), NULL, 0), PT_OK);
    assert_int_equal(hw.n_shapes, 3);
    near("shape 0 m", hw.shapes[0].m, 64), near("shape 0 n", hw.shapes[0].n, 128);
    near("shape 0 k", hw.shapes[0].k, 256), near("shape 0 flops", hw.shapes[0].flops, 1.5e9);
    near("shape 2 m", hw.shapes[2].m, 4096), near("shape 2 flops", hw.shapes[2].flops, 3e10);
    /* the measured collectives and skew (default: none, 0) */
    near("default skew", hw.skew, 0), near("default overlap_slowdown", hw.overlap_slowdown, 0);
    assert_int_equal(hw.nccl, 0); /* comm = mpi */
    assert_int_equal(hw.n_colls, 0);
    snprintf(text, sizeof text, "%scollectives = \"ar,intra,2,65536,2.5e-4;\n    rs,inter,4,1048576,"
             "0.5; ag,intra,8,16777216,1e-3; p2p,inter,2,524288,4e-3\"\nskew = 0.03\ninter_rendezvous = \"4096,0; 16384,1\"\n"
             "inter_overlap = \"65536,0.8;\n    16777216,0.05\"\nintra_overlap = 0.3\n", good);
    assert_int_equal(pt_hardware_load(&hw, write_ini("colls.ini", text), NULL, 0), PT_OK);
    assert_int_equal(hw.n_colls, 4);
    assert_int_equal(hw.colls[3].kind, PT_HW_P2P), assert_int_equal(hw.colls[3].inter, 1);
    near("p2p bytes", hw.colls[3].bytes, 524288), near("p2p s", hw.colls[3].seconds, 4e-3);
    assert_int_equal(hw.colls[0].kind, PT_HW_AR), assert_int_equal(hw.colls[0].inter, 0);
    assert_int_equal(hw.colls[1].kind, PT_HW_RS), assert_int_equal(hw.colls[1].inter, 1);
    assert_int_equal(hw.colls[1].ranks, 4), assert_int_equal(hw.colls[2].kind, PT_HW_AG);
    near("coll 1 bytes", hw.colls[1].bytes, 1048576), near("coll 1 s", hw.colls[1].seconds, 0.5);
    near("coll 2 bytes", hw.colls[2].bytes, 16777216), near("skew", hw.skew, 0.03);
    /* figures by message size: linear in log bytes between entries, the ends beyond them */
    assert_int_equal(hw.rendezvous[1].n, 2), assert_int_equal(hw.overlap[1].n, 2);
    near("rendezvous at 4 KiB", pt_hw_sizes_at(&hw.rendezvous[1], 4096, 0), 0);
    near("rendezvous at 1 MiB", pt_hw_sizes_at(&hw.rendezvous[1], 1 << 20, 0), 1);
    near("rendezvous at 1 KiB", pt_hw_sizes_at(&hw.rendezvous[1], 1024, 0), 0);
    near("overlap at 64 KiB", pt_hw_sizes_at(&hw.overlap[1], 65536, 1), 0.8);
    near("overlap at 1 MiB (halfway in log)", pt_hw_sizes_at(&hw.overlap[1], 1 << 20, 1), 0.425);
    near("overlap at 64 MiB", pt_hw_sizes_at(&hw.overlap[1], 64 << 20, 1), 0.05);
    near("intra_overlap, one share", pt_hw_sizes_at(&hw.overlap[0], 1 << 20, 1), 0.3);
    near("no intra_rendezvous: the default", pt_hw_sizes_at(&hw.rendezvous[0], 1 << 20, 0), 0);
}

static void test_write_reads_back(void **state) {
    (void)state;
    pt_hardware hw, back;
    assert_int_equal(pt_hardware_load(&hw, write_ini("w.ini", good), NULL, 0), PT_OK);
    hw.gemm_efficiency = 0.75;
    hw.n_shapes = PT_HW_MAX_SHAPES; /* the most a file holds, over lines of at most 199 bytes */
    for (int i = 0; i < hw.n_shapes; i++)
        hw.shapes[i] = (pt_gemm_shape){64 << (i % 7), 4096 + i, 1 + 3 * i, 1.234567e9 * (i + 1)};
    const char *how[PT_HW_N_KEYS] = {0};
    for (int i = 0; i < PT_HW_N_KEYS; i++) how[i] = "measured; by a ping-pong = of \"8\" bytes";
    const char *out = write_ini("written.ini", "");
    assert_int_equal(pt_hardware_write(&hw, out, how), PT_OK);
    if (pt_hardware_load(&back, out, NULL, 0) != PT_OK) fail_msg("%s", pt_last_error());
    assert_string_equal(back.name, hw.name);
    assert_int_equal(back.devices_per_node, 2), assert_int_equal(back.nodes, 3);
    near("efficiency", back.gemm_efficiency, 0.75);
    near("inter_latency", back.inter_latency, 2e-5);
    assert_int_equal(back.n_shapes, PT_HW_MAX_SHAPES);
    for (int i = 0; i < hw.n_shapes; i++) {
        assert_true(back.shapes[i].m == hw.shapes[i].m && back.shapes[i].n == hw.shapes[i].n &&
                    back.shapes[i].k == hw.shapes[i].k);
        if (fabs(back.shapes[i].flops / hw.shapes[i].flops - 1) > 1e-3)
            fail_msg("shape %d: %g read back as %g", i, hw.shapes[i].flops, back.shapes[i].flops);
    }
    hw.n_colls = PT_HW_MAX_COLLS, hw.skew = 0.0125, hw.overlap_slowdown = 0.189, hw.nccl = 1;
    hw.overlap[1] = (pt_hw_sizes){.n = PT_HW_MAX_SIZES};
    for (int i = 0; i < PT_HW_MAX_SIZES; i++) hw.overlap[1].bytes[i] = 4096 << i, hw.overlap[1].value[i] = 0.0625 * i;
    hw.rendezvous[0] = (pt_hw_sizes){.n = 1, .value = {1}};
    for (int i = 0; i < hw.n_colls; i++)
        hw.colls[i] = (pt_coll_time){(pt_hw_coll)(i % 3), i % 2, 2 + i, 65536.0 * (i + 1), 1.5e-4 * (i + 1)};
    hw.colls[PT_HW_MAX_COLLS - 1] = (pt_coll_time){PT_HW_P2P, 1, 2, 1048576, 8e-3};
    assert_int_equal(pt_hardware_write(&hw, out, how), PT_OK);
    if (pt_hardware_load(&back, out, NULL, 0) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(back.n_colls, PT_HW_MAX_COLLS);
    near("skew back", back.skew, 0.0125), near("slowdown back", back.overlap_slowdown, 0.189);
    assert_int_equal(back.nccl, 1);
    assert_int_equal(back.overlap[1].n, PT_HW_MAX_SIZES), assert_int_equal(back.rendezvous[0].n, 1);
    for (int i = 0; i < PT_HW_MAX_SIZES; i++)
        near("overlap entry back", back.overlap[1].value[i], 0.0625 * i), near("its size", back.overlap[1].bytes[i], 4096 << i);
    near("one rendezvous value back", pt_hw_sizes_at(&back.rendezvous[0], 1, 0), 1);
    hw.overlap[1].n = 0, hw.rendezvous[0].n = 0;
    for (int i = 0; i < hw.n_colls; i++) {
        const pt_coll_time *a = &hw.colls[i], *b = &back.colls[i];
        assert_true(a->kind == b->kind && a->inter == b->inter && a->ranks == b->ranks && a->bytes == b->bytes);
        if (fabs(b->seconds / a->seconds - 1) > 1e-3) fail_msg("collective %d: %g read back as %g", i, a->seconds, b->seconds);
    }
    hw.n_colls = 0, hw.skew = 0;
    /* without comments, and without shapes: no gemm_shapes line */
    hw.n_shapes = 0;
    assert_int_equal(pt_hardware_write(&hw, out, NULL), PT_OK);
    assert_int_equal(pt_hardware_load(&back, out, NULL, 0), PT_OK);
    assert_int_equal(back.n_shapes, 0);
}

static void test_bad_files_are_named(void **state) {
    (void)state;
    pt_hardware hw;
    expect_error(load_variant("unknown.ini", NULL, "nvlink_bw = 1e9\n"), "unknown key",
                 "unknown.ini:12", "unknown key \"nvlink_bw\"");
    expect_error(load_variant("section.ini", NULL, "[model]\ndim = 4\n"), "unknown section",
                 "section.ini:13", "unknown section [model]");
    expect_error(load_variant("missing.ini", "inter_bw", NULL), "one key missing",
                 "missing.ini: missing key inter_bw", NULL);
    expect_error(load_variant("missing2.ini", "in", NULL), "missing keys",
                 "missing2.ini: missing keys intra_bw, intra_latency, inter_bw, inter_latency", NULL);
    expect_error(load_variant("neg.ini", "peak_flops", "peak_flops = -3e12\n"), "negative",
                 "neg.ini:11", "peak_flops = -3e12: must be > 0");
    expect_error(load_variant("ov.ini", NULL, "inter_overlap = 1.5\n"), "a share above 1",
                 "ov.ini:12", "inter_overlap: entry 1 \"1.5\": the value must be in [0, 1]");
    expect_error(load_variant("quant.ini", NULL, "gemm_units = 108\n"), "units without tiles",
                 "quant.ini: gemm_units, gemm_tile_m and gemm_tile_n go together", NULL);
    expect_error(load_variant("zero.ini", "memory_bw", "memory_bw = 0\n"), "zero", "zero.ini",
                 "memory_bw = 0: must be > 0");
    expect_error(load_variant("frac.ini", "nodes", "nodes = 2.5\n"), "fractional nodes",
                 "frac.ini", "nodes: expected a positive integer");
    expect_error(load_variant("dpn.ini", "devices_per_node", "devices_per_node = 0\n"),
                 "zero devices", "dpn.ini", "devices_per_node: expected a positive integer");
    expect_error(load_variant("eff.ini", NULL, "gemm_efficiency = 1.5\n"), "efficiency > 1",
                 "eff.ini", "gemm_efficiency = 1.5: must be in (0, 1]");
    expect_error(load_variant("word.ini", "intra_bw", "intra_bw = fast\n"), "not a number",
                 "word.ini", "intra_bw: expected a number");
    expect_error(load_variant("twice.ini", NULL, "nodes = 4\n"), "given twice", "twice.ini",
                 "nodes given twice");
    expect_error(load_variant("shape3.ini", NULL, "gemm_shapes = \"64,64,64\"\n"),
                 "three numbers", "shape3.ini", "gemm_shapes: entry 1 \"64,64,64\"");
    expect_error(load_variant("shapex.ini", NULL, "gemm_shapes = 64,64,64,1e9;64,x,64,1e9\n"),
                 "not a number", "shapex.ini", "entry 2 \"64,x,64,1e9\"");
    expect_error(load_variant("shapem.ini", NULL, "gemm_shapes = 64.5,64,64,1e9\n"),
                 "fractional m", "shapem.ini", "must be positive integers");
    expect_error(load_variant("shapef.ini", NULL, "gemm_shapes = 64,64,64,-1\n"),
                 "negative flops", "shapef.ini", "flops must be > 0");
    expect_error(load_variant("collk.ini", NULL, "collectives = \"a2a,intra,2,65536,1e-4\"\n"),
                 "unknown collective", "collk.ini", "collectives: entry 1 \"a2a,intra,2,65536,1e-4\"");
    expect_error(load_variant("collw.ini", NULL, "collectives = ar,intra,2,65536,1e-4; ar,node,2,65536,1e-4\n"),
                 "unknown where", "collw.ini", "entry 2 \"ar,node,2,65536,1e-4\": expected");
    expect_error(load_variant("collp.ini", NULL, "collectives = p2p,inter,4,65536,1e-4\n"),
                 "p2p among 4", "collp.ini", "a p2p entry is one message between 2 ranks");
    expect_error(load_variant("collr.ini", NULL, "collectives = ar,intra,1,65536,1e-4\n"),
                 "one rank", "collr.ini", "ranks must be an integer >= 2");
    expect_error(load_variant("colls.ini", NULL, "collectives = rs,inter,2,65536,0\n"),
                 "zero seconds", "colls.ini", "bytes and seconds > 0");
    expect_error(load_variant("skew.ini", NULL, "skew = -0.1\n"), "negative skew", "skew.ini",
                 "skew = -0.1: must be in [0, 1]");
    expect_error(load_variant("slow.ini", NULL, "overlap_slowdown = 1.5\n"), "a slowdown above 1",
                 "slow.ini", "overlap_slowdown = 1.5: must be in [0, 1]");
    expect_error(load_variant("comm.ini", NULL, "comm = gloo\n"), "an unknown comm", "comm.ini",
                 "comm = gloo: expected mpi");
    expect_error(load_variant("rv.ini", NULL, "inter_rendezvous = \"4096,0; 16384,0.5\"\n"), "a half rendezvous",
                 "rv.ini", "inter_rendezvous: entry 2 \"16384,0.5\": the value must be 0 or 1");
    expect_error(load_variant("ovs.ini", NULL, "inter_overlap = \"65536,0.5; 4096,0.9\"\n"), "sizes descending",
                 "ovs.ini", "inter_overlap: entry 2 \"4096,0.9\": sizes must be >= 1 byte and ascending");
    expect_error(load_variant("ovm.ini", NULL, "intra_overlap = \"0.5; 4096,0.9\"\n"), "one share and a list",
                 "ovm.ini", "sizes must be >= 1 byte and ascending, or one value alone");
    expect_error(load_variant("ovv.ini", NULL, "intra_overlap = \"4096,1.5\"\n"), "a share above 1 at a size",
                 "ovv.ini", "the value must be in [0, 1]");
    expect_error(load_variant("quote.ini", "name", "name = \"H100 ; box\"\n"), "cut quote",
                 "quote.ini", "name: unmatched quote");
    /* the file itself */
    pt_status st = pt_hardware_load(&hw, "/nonexistent/h.ini", NULL, 0);
    assert_int_equal(st, PT_ERR_IO);
    assert_non_null(strstr(pt_last_error(), "/nonexistent/h.ini"));
    /* overrides */
    const char *path = write_ini("ov.ini", good);
    const char *o1[] = {"--hardware.nodez=4"}, *o2[] = {"--nodes=4"}, *o3[] = {"--hardware.nodes=-1"};
    expect_error(pt_hardware_load(&hw, path, o1, 1), "unknown override", "hardware.nodez=4",
                 "unknown key \"nodez\"");
    expect_error(pt_hardware_load(&hw, path, o2, 1), "no prefix", "--nodes=4",
                 "expected hardware.KEY=VALUE");
    expect_error(pt_hardware_load(&hw, path, o3, 1), "bad override value", "hardware.nodes=-1",
                 "nodes: expected a positive integer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_files),
        cmocka_unit_test(test_defaults_and_shapes),
        cmocka_unit_test(test_write_reads_back),
        cmocka_unit_test(test_bad_files_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
