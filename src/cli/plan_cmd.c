/* plan_cmd.c: `pentatron plan`: the memory and step time of a layout on a cluster, or the best
 * layouts (--search), from the model in src/plan/plan.c. No MPI (but --measure, which measures
 * the machine it runs on: src/plan/measure.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/config.h"
#include "pt/plan.h"

static void pt_plan_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron plan [--config FILE] [--section.key=value ...] --hardware FILE\n"
            "                      [--hardware.key=value ...] [--search] [--json]\n"
            "       pentatron plan --measure --out FILE [--threads N] [--precision fp32|bf16]\n"
            "\n"
            "Predicts, for the model, batch and layout of the configuration (the keys of `pentatron\n"
            "train`, plus plan.*) on the cluster of the hardware file (hardware/*.ini, or one\n"
            "written by --measure), each rank's memory by kind and the step's time: compute,\n"
            "recomputation, the communication each dimension leaves exposed, the pipeline bubble,\n"
            "tokens/s and MFU. docs/plan.md gives every formula.\n"
            "\n"
            "  --hardware FILE        the cluster ([hardware] name, devices_per_node, nodes,\n"
            "                         peak_flops, memory_bytes, memory_bw, intra_bw, ...)\n"
            "  --hardware.KEY=VALUE   override a key of the file (e.g. --hardware.nodes=64)\n"
            "  --search               every valid layout on all the hardware's devices (degrees,\n"
            "                         ZeRO, schedule, micro-batch, recomputation), those that fit\n"
            "                         with plan.headroom free, ranked by tokens/s; plan.top printed\n"
            "                         with what makes the best faster than the next\n"
            "  --json                 one JSON object per layout, one per line\n"
            "  --anyway               plan a layout that does not fit the devices' memory (without\n"
            "                         it, such a layout is printed and plan exits 1)\n"
            "  --measure              write a hardware file for this machine (run under mpirun;\n"
            "                         ranks on several hosts measure the links between hosts)\n");
}

/* Why a beats b: the parts of the step where they differ most. */
static void pt_plan_why(const pt_plan *a, const pt_plan *b, FILE *f) {
    static const char *dims[] = {"dp", "tp", "pp", "cp", "ep"};
    struct {
        const char *what;
        double d;
    } parts[16];
    int n = 0;
    parts[n++] = (typeof(parts[0])){"compute", b->compute - b->recompute_s - (a->compute - a->recompute_s)};
    parts[n++] = (typeof(parts[0])){"recomputation", b->recompute_s - a->recompute_s};
    parts[n++] = (typeof(parts[0])){"pipeline bubble", b->bubble - a->bubble};
    char buf[5][32];
    for (int i = 0; i < PT_PLAN_DIMS; i++) {
        snprintf(buf[i], sizeof buf[i], "exposed %s communication", dims[i]);
        parts[n++] = (typeof(parts[0])){buf[i], b->exposed[i] - a->exposed[i]};
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (fabs(parts[j].d) > fabs(parts[i].d)) {
                typeof(parts[0]) t = parts[i];
                parts[i] = parts[j], parts[j] = t;
            }
    fprintf(f, "  #1 is %.1f%% faster than #2 (%.4g s against %.4g s per step):", 100 * (b->step / a->step - 1),
            a->step, b->step);
    for (int i = 0; i < 3 && fabs(parts[i].d) > 1e-4 * a->step; i++)
        fprintf(f, "%s %s %+.3g s", i ? "," : "", parts[i].what, -parts[i].d);
    fprintf(f, " (#1's minus #2's)\n");
}

int pt_cmd_plan(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--measure")) return pt_plan_measure_cmd(argc, argv);
    const char *hw_path = NULL;
    int search = 0, json = 0, anyway = 0, n_rest = 0, n_over = 0, unfit = 0;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    const char **over = calloc((size_t)argc + 1, sizeof *over);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_plan_usage(stdout);
            free(rest), free(over);
            return 0;
        } else if (!strcmp(argv[i], "--hardware") && i + 1 < argc) {
            hw_path = argv[++i];
        } else if (!strncmp(argv[i], "--hardware=", 11)) {
            hw_path = argv[i] + 11;
        } else if (!strncmp(argv[i], "--hardware.", 11)) {
            over[n_over++] = argv[i] + 2;
        } else if (!strcmp(argv[i], "--search")) {
            search = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--anyway")) {
            anyway = 1;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    pt_config *cfg = calloc(1, sizeof *cfg);
    pt_hardware hw;
    pt_status st = PT_OK;
    if (!hw_path) st = pt_errorf(PT_ERR_CONFIG, "plan: --hardware FILE is required (hardware/*.ini, "
                                 "or one written by pentatron plan --measure)");
    if (st == PT_OK) st = pt_hardware_load(&hw, hw_path, over, n_over);
    if (st == PT_OK) {
        pt_config_defaults(cfg);
        st = pt_config_from_args(cfg, n_rest, rest);
    }
    if (st == PT_OK) st = pt_config_validate(cfg);
    if (st == PT_OK && search) {
        pt_plan *res = NULL;
        int n = 0, fit = 0, tried = 0;
        pt_plan least = {0};
        st = pt_plan_search(cfg, &hw, &res, &n, &fit, &tried, &least);
        if (st == PT_OK && n == 0 && least.memory_max > 0)
            st = pt_errorf(PT_ERR_CONFIG, "plan --search: no layout fits: %.1f GB a device may be "
                           "used (%.4g GB with %.0f%% kept free), and the least any of the %d layouts "
                           "tried needs is %.1f GB (dp%d pp%d cp%d tp%d ep%d, ZeRO-%d, micro-batch %d, "
                           "schedule %s, recompute %s); "
                           "more devices (--hardware.nodes) or a shorter sequence "
                           "would lower it", hw.memory_bytes * (1 - cfg->plan.headroom) / 1e9,
                           hw.memory_bytes / 1e9, 100 * cfg->plan.headroom, tried,
                           least.memory_max / 1e9, least.dp, least.pp, least.cp, least.tp, least.ep,
                           least.zero, least.micro_batch,
                           least.pp > 1 ? pt_schedule_kind_name(least.sched) : "-",
                           least.recompute == 2 ? "full" : least.recompute == 1 ? "selective" : "none");
        else if (st == PT_OK && n == 0)
            st = pt_errorf(PT_ERR_CONFIG, "plan --search: none of the %d layouts tried is valid on "
                           "%d devices", tried, hw.devices_per_node * hw.nodes);
        int top = cfg->plan.top < n ? cfg->plan.top : n;
        if (st == PT_OK && json) {
            for (int i = 0; i < top; i++) pt_plan_json(&res[i], stdout), fputc('\n', stdout);
        } else if (st == PT_OK) {
            printf("searched %d layouts on %s (%d node%s × %d): %d fit with %.0f%% of %.4g GB "
                   "kept free; the best %d:\n", tried, hw.name, hw.nodes, hw.nodes == 1 ? "" : "s",
                   hw.devices_per_node, fit, 100 * cfg->plan.headroom, hw.memory_bytes / 1e9, top);
            printf("  %-3s %-34s %-18s %6s %10s %12s %6s %9s\n", "#", "layout", "schedule", "mb/m",
                   "recompute", "tokens/s", "MFU", "mem max");
            for (int i = 0; i < top; i++) {
                const pt_plan *p = &res[i];
                char lay[64], sch[32], mm[16];
                snprintf(lay, sizeof lay, "dp%d pp%d cp%d tp%d%s ep%d Z%d", p->dp, p->pp, p->cp,
                         p->tp, p->sp ? "sp" : "", p->ep, p->zero);
                snprintf(sch, sizeof sch, "%s%s", pt_schedule_kind_name(p->sched),
                         p->chunks > 1 ? " v2" : "");
                snprintf(mm, sizeof mm, "%d/%d", p->micro_batch, p->m);
                printf("  %-3d %-34s %-18s %6s %10s %12.6g %5.1f%% %7.1f GB\n", i + 1, lay,
                       p->pp > 1 ? sch : "-", mm,
                       p->recompute == 2 ? "full" : p->recompute == 1 ? "selective" : "none",
                       p->tokens_per_second, 100 * p->mfu, p->memory_max / 1e9);
            }
            if (top >= 2) pt_plan_why(&res[0], &res[1], stdout);
            printf("\nthe best in full:\n");
            pt_plan_print(&res[0], cfg, &hw, stdout);
        }
        free(res);
    } else if (st == PT_OK) {
        pt_plan p;
        st = pt_plan_eval(cfg, &hw, &p);
        if (st == PT_OK && json) pt_plan_json(&p, stdout), fputc('\n', stdout);
        else if (st == PT_OK) pt_plan_print(&p, cfg, &hw, stdout);
        if (st == PT_OK && p.memory_max > hw.memory_bytes && !anyway) {
            /* printed, then said plainly: a layout that does not fit is not a plan to run */
            fflush(stdout);
            fprintf(stderr, "pentatron plan: the layout does not fit: its largest rank (pipeline "
                    "stage %d) needs %.4g GB of the device's %.4g GB (--anyway plans it without "
                    "this exit status)\n", p.memory_max_stage, p.memory_max / 1e9, hw.memory_bytes / 1e9);
            unfit = 1;
        }
    }
    free(cfg), free(rest), free(over);
    if (st != PT_OK) {
        fprintf(stderr, "pentatron plan: %s\n", pt_last_error());
        return pt_cli_exit(st, 0); /* its input refused: 2 (cli/commands.h) */
    }
    return unfit ? 1 : 0;
}
