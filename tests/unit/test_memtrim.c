/* Unit tests for core/base/memtrim.c on a real libuv loop: a trim follows a burst of large
 * frees once a quiet second passed, not during the burst, and never for small amounts. */
#include "base/memtrim.h"
#include "mgtest.h"

#include <string.h>
#include <uv.h>

typedef struct {
    mg_memtrim_t mt;
    uv_timer_t tick;
    int ticks;
    int note_ticks; /* ticks (100 ms apart) on which 1 MiB more is noted */
    uint64_t trims_during_burst;
    size_t tail;   /* noted once after the first trim (0: none); the run then waits for a second */
    int tail_tick; /* the tick it was noted on */
    int done;
} env_t;

static env_t E;

static void on_tick(uv_timer_t *t)
{
    E.ticks++;
    if (E.ticks <= E.note_ticks) {
        mg_memtrim_note(&E.mt, 1u << 20);
        if (E.ticks == E.note_ticks) E.trims_during_burst = E.mt.trims;
    }
    if (E.tail && E.mt.trims == 1 && !E.tail_tick) {
        mg_memtrim_note(&E.mt, E.tail);
        E.tail_tick = E.ticks;
    }
    uint64_t want = E.tail ? 2 : 1;
    int quiet_since = E.tail_tick ? E.tail_tick : E.note_ticks;
    if (E.mt.trims >= want || E.ticks >= quiet_since + 25) { /* trimmed, or 2.5 s quiet without */
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
        mg_memtrim_close(&E.mt);
    }
}

static void run_tail(int note_ticks, size_t first_note, size_t tail)
{
    memset(&E, 0, sizeof(E));
    E.tail = tail;
    uv_loop_t loop;
    CHECK_EQ_INT(uv_loop_init(&loop), 0);
    CHECK_EQ_INT(mg_memtrim_init(&E.mt, &loop), 0);
    E.note_ticks = note_ticks;
    if (first_note) mg_memtrim_note(&E.mt, first_note);
    uv_timer_init(&loop, &E.tick);
    uv_timer_start(&E.tick, on_tick, 100, 100);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

static void run(int note_ticks, size_t first_note)
{
    run_tail(note_ticks, first_note, 0);
}

/* 20 MiB freed over 2 s (1 MiB every 100 ms): no trim while it goes on, one after it. */
static void test_trim_after_the_burst(void)
{
    run(20, 0);
    CHECK_EQ_INT(E.trims_during_burst, 0);
    CHECK_EQ_INT(E.mt.trims, 1);
    CHECK(E.ticks > 20 + 5); /* at least the quiet second after the last note */
}

/* Less than MG_MEMTRIM_MIN_BYTES: never trimmed. */
static void test_small_frees_not_trimmed(void)
{
    run(0, MG_MEMTRIM_MIN_BYTES - 1);
    CHECK_EQ_INT(E.mt.trims, 0);
}

/* A burst's tail of 1 MiB (the last slow readers' buffers, freed after the burst was
 * trimmed) is trimmed too, after its own quiet second. */
static void test_the_tail_of_a_burst_trimmed(void)
{
    run_tail(20, 0, 1u << 20);
    CHECK_EQ_INT(E.mt.trims, 2);
    CHECK(E.tail_tick > 0);
}

int main(void)
{
    MG_RUN(test_trim_after_the_burst);
    MG_RUN(test_small_frees_not_trimmed);
    MG_RUN(test_the_tail_of_a_burst_trimmed);
    return mg_test_summary();
}
