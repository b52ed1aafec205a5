/* elastic_sgd_c: elastic_sgd through the C API (er_state, er_run), same arithmetic.
 *
 *   elasticrun -np 3 build/examples/elastic_sgd_c --steps 200
 *
 * Takes --steps, --dim, --batch, --commit-every and --seed with elastic_sgd's
 * defaults, and prints the same `final step=N begun=B commits=C commit_sum=X hash=H` line as
 * `elastic_sgd --reference` with those flags: a check of the C bindings against the
 * C++ program. See elastic_sgd.cc for the fixed-point scheme.
 */
#include <elasticrun/elasticrun.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FRAC_W = 16, FRAC_X = 7, LR_NUM = 3 };

typedef struct {
  int64_t steps, commit_every;
  int dim, batch;
  uint64_t seed;
} options;

typedef struct {
  int64_t commits, commit_sum;
} commit_log;

/* Everything the training body needs, passed through er_run's void*. */
typedef struct {
  options o;
  int64_t *w, *wstar, *x, *grad;
  int64_t step;
  int64_t begun; /* steps begun: incremented before the allreduce, rolled back by restore */
  commit_log log;
} trainer;

static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t hash4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return mix(seed ^ mix(a ^ mix(b ^ mix(c))));
}

static int bit_width(unsigned v) {
  int n = 0;
  while (v) {
    ++n;
    v >>= 1;
  }
  return n;
}

/* Sum of per-sample gradients over this rank's share (i = rank mod size). */
static void local_gradient(trainer* t, int rank, int size) {
  const options* o = &t->o;
  memset(t->grad, 0, sizeof(int64_t) * (size_t)o->dim);
  for (int64_t i = rank; i < o->batch; i += size) {
    int64_t pred = 0, target = 0;
    for (int j = 0; j < o->dim; ++j) {
      t->x[j] = (int64_t)(hash4(o->seed, (uint64_t)t->step, (uint64_t)i, (uint64_t)j) & 0xFF) - 128;
      pred += t->w[j] * t->x[j];
      target += t->wstar[j] * t->x[j];
    }
    int64_t noise = (int64_t)(hash4(o->seed, (uint64_t)t->step, (uint64_t)i, ~0ULL) & 0x3FF) - 512;
    int64_t err = (pred >> FRAC_X) - (target >> FRAC_X) - noise;
    for (int j = 0; j < o->dim; ++j) t->grad[j] += (err * t->x[j]) >> FRAC_X;
  }
}

/* er_run's body: returns ER_OK at the end, or the code of the call that failed,
 * which er_run turns into a restore / re-join and another call. */
static int train(er_state* st, void* arg) {
  trainer* t = arg;
  int shift = bit_width((unsigned)t->o.batch) + 2;
  while (t->step < t->o.steps) {
    ++t->begun;
    local_gradient(t, er_rank(), er_size());
    int rc = er_allreduce(t->grad, t->grad, (size_t)t->o.dim, ER_I64, ER_SUM);
    if (rc != ER_OK) return rc;
    for (int j = 0; j < t->o.dim; ++j) t->w[j] -= (LR_NUM * t->grad[j]) >> shift;
    ++t->step;
    if (t->step % t->o.commit_every != 0 && t->step != t->o.steps) continue;
    ++t->log.commits;
    t->log.commit_sum += t->step;
    rc = er_state_commit(st);
    /* Reported once taken, also when the commit says hosts were updated (the commit
     * stands); tests wait for it to know that training is under way. */
    if ((rc == ER_OK || rc == ER_HOSTS_UPDATED) && er_rank() == 0) {
      printf("committed step %lld size %d\n", (long long)t->step, er_size());
      fflush(stdout);
    }
    if (rc != ER_OK) return rc;
  }
  return ER_OK;
}

static void on_reset(void* arg) {
  (void)arg;
  printf("reset: size %d rank %d\n", er_size(), er_rank());
  fflush(stdout);
}

static int parse(int argc, char** argv, options* o) {
  *o = (options){.steps = 100, .commit_every = 10, .dim = 16, .batch = 64, .seed = 1};
  for (int i = 1; i + 1 < argc; i += 2) {
    long long v = atoll(argv[i + 1]);
    if (!strcmp(argv[i], "--steps") && v >= 0) o->steps = v;
    else if (!strcmp(argv[i], "--dim") && v >= 1 && v <= 1 << 20) o->dim = (int)v;
    else if (!strcmp(argv[i], "--batch") && v >= 1 && v <= 1 << 24) o->batch = (int)v;
    else if (!strcmp(argv[i], "--commit-every") && v >= 1) o->commit_every = v;
    else if (!strcmp(argv[i], "--seed") && v >= 0) o->seed = (uint64_t)v;
    else return -1;
  }
  return argc % 2 == 1 ? 0 : -1;
}

static void print_final(const trainer* t) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int j = 0; j < t->o.dim; ++j)
    for (int b = 0; b < 8; ++b) h = (h ^ (((uint64_t)t->w[j] >> (8 * b)) & 0xFF)) * 0x100000001b3ULL;
  printf("final step=%lld begun=%lld commits=%lld commit_sum=%lld hash=%016llx\n", (long long)t->step,
         (long long)t->begun, (long long)t->log.commits, (long long)t->log.commit_sum, (unsigned long long)h);
  fflush(stdout);
}

static int run(trainer* t) {
  er_state* st = er_state_new();
  if (!st) return ER_ERROR;
  int rc = er_state_track(st, "w", t->w, (size_t)t->o.dim, ER_I64);
  if (rc == ER_OK) rc = er_state_track(st, "step", &t->step, 1, ER_I64);
  if (rc == ER_OK) rc = er_state_track(st, "begun", &t->begun, 1, ER_I64);
  if (rc == ER_OK) rc = er_state_track(st, "commit_log", &t->log, sizeof t->log, ER_U8);
  if (rc == ER_OK) rc = er_state_on_reset(st, on_reset, NULL);
  if (rc == ER_OK) rc = er_run(st, train, t);
  er_state_free(st);
  return rc;
}

int main(int argc, char** argv) {
  trainer t = {0};
  if (parse(argc, argv, &t.o) != 0) {
    fprintf(stderr, "usage: elastic_sgd_c [--steps N] [--dim D] [--batch B] [--commit-every K] [--seed S]\n");
    return 2;
  }
  size_t n = (size_t)t.o.dim;
  t.w = calloc(n, sizeof *t.w), t.wstar = calloc(n, sizeof *t.w);
  t.x = calloc(n, sizeof *t.w), t.grad = calloc(n, sizeof *t.w);
  if (!t.w || !t.wstar || !t.x || !t.grad) return 1;
  for (int j = 0; j < t.o.dim; ++j)
    t.wstar[j] = (int64_t)(hash4(t.o.seed, ~0ULL, 0, (uint64_t)j) % (4ULL << FRAC_W)) - (2LL << FRAC_W);
  int rc = er_init();
  if (rc == ER_OK) rc = run(&t);
  if (rc == ER_OK) print_final(&t);
  else fprintf(stderr, "elastic_sgd_c: %s\n", er_last_error());
  er_shutdown();
  free(t.w), free(t.wstar), free(t.x), free(t.grad);
  return rc == ER_OK ? 0 : 1;
}
