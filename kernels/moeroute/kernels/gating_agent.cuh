// SPDX-License-Identifier: Apache-2.0
// The per-token step of the gating kernel: one group of Lanes threads routes one token with its
// row of logits in registers (warp::register_row), in the order of reference::gating:
//   1. load, sanitise, logsumexp of the clean logits      4. group limit
//   2. noise                                              5. top-(k + R), best first
//   3. gate scores and selection values (+ bias)          6. gates, written out
//   7. the aux-loss inputs: P of the token, and which experts it counts for
// The kernel (gating.cuh) owns the chunk loop and the block's accumulators; this file owns the
// arithmetic, which rounds exactly as the reference does (gating_math.cuh).
#pragma once

#include <cfloat>
#include <cstdint>

#include <moeroute/gating_plan.hpp>
#include <moeroute/kernels/element.cuh>
#include <moeroute/kernels/gating_math.cuh>
#include <moeroute/kernels/gating_semantics.cuh>
#include <moeroute/kernels/warp_topk.cuh>
#include <moeroute/replay.hpp>
#include <moeroute/rng.hpp>
#include <moeroute/types.hpp>

namespace moeroute::kernels {

/// Everything the gating kernel reads and writes.
template <class Element>
struct gating_kernel_args {
  const Element* logits = nullptr;      ///< [T, E]
  const float* bias = nullptr;          ///< [E] or null
  const std::uint8_t* valid = nullptr;  ///< [T] or null (all valid)
  std::int64_t tokens = 0;
  gating_result out{};     ///< ids, gates, reroute_ids, logsumexp (the sums: the reduce kernel)
  gating_partials part{};  ///< [chunks, ...] this kernel's per-chunk sums
  gating_semantics sem{};
  gating_plan plan{};
  std::int32_t slots = 0;     ///< slots a lane uses (the generic kernel; <= its Slots)
  bool vector_loads = false;  ///< rows are 16-byte aligned: read them 16 bytes at a time
  gating_replay replay{};     ///< routing replay (d_replaced / d_invalid zeroed by the launcher)
  /// The aux-loss inputs are wanted (P sums, counts, per-token P or count ids): false on the
  /// inference path, which then makes no P row and counts nothing
  bool aux = true;
  double replay_log_ratio = 0.0;  ///< replay_log_ratio(replay.min_score_ratio)
};

/// @brief Elements per lane read at once: 16 bytes when Slots elements fill them.
template <class Element, int Slots>
inline constexpr int gating_vec = (Slots * sizeof(Element) >= 16)
                                      ? static_cast<int>(16 / sizeof(Element))
                                      : 1;

/// @brief One token group's registers and the steps that fill them.
/// @tparam Generic the row lives in local memory, slot count known at run time (E > 512)
template <class Element, int Lanes, int Slots, bool Generic>
struct gating_agent {
  static constexpr int Vec = gating_vec<Element, Slots>;
  static constexpr int Unroll = Generic ? 1 : Slots;
  using row_layout = warp::register_row<Lanes, Vec>;
  using group_layout = warp::register_row<Lanes, 1>;  // group g at lane g % Lanes, slot g / Lanes

  const gating_kernel_args<Element>& a;
  const gating_semantics& sem;
  const int lane;
  const int ns;  // slots in use
  const int E;
  // E - (this lane's first expert): slot s is in the row iff index(0, s) < limit, a compare
  // with a constant (see expert() for why not expert(s) < E)
  const int limit;

  float x[Slots];     // clean, sanitised logits
  float sel[Slots];   // selection values; after the top-k: the aux P
  float gsrc[Slots];  // gate scores (or the gate logits for softmax after top-k)
  float rv[Slots];    // rank j at lane j % Lanes, slot j / Lanes: gate; first: group scores
  int ri[Slots];      // rank j: expert id; first: chosen-group flags
  warp::slot_mask<Slots> allowed;

  __device__ __forceinline__ gating_agent(const gating_kernel_args<Element>& args, int lane_)
      : a(args),
        sem(args.sem),
        lane(lane_),
        ns(Generic ? args.slots : Slots),
        E(args.sem.experts),
        limit(args.sem.experts - row_layout::index(lane_, 0)) {}

  /// Expert id of slot s. The lane's first id goes through an empty asm each time: otherwise
  /// nvcc hoists every slot's id out of the token loop into a register of its own, and at E = 256
  /// (128 registers) spills them; an add in the loop costs less than a local-memory reload.
  __device__ __forceinline__ int expert(int s) const {
    int first = E - limit;
#ifdef __CUDA_ARCH__
    asm volatile("" : "+r"(first));
#endif
    return row_layout::index(0, s) + first;
  }

  /// Slot s holds an expert (< E), not row padding.
  __device__ __forceinline__ bool in_row(int s) const { return row_layout::index(0, s) < limit; }

  /// f(s) for every slot in use, unrolled when the row lives in registers.
  template <class F>
  __device__ __forceinline__ void for_slots(F&& f) const {
#pragma unroll Unroll
    for (int s = 0; s < Slots; ++s) {
      if (Generic && s >= ns) break;  // a register row: every slot, a compile-time count
      f(s);
    }
  }

  // --- 1. load, sanitise, logsumexp -----------------------------------------------------------

  /// Reads row t into x (out-of-range slots -FLT_MAX); returns the NaN/Inf count of the group.
  __device__ __forceinline__ int load_row(std::int64_t t) {
    const Element* row = a.logits + t * E;
    int nonfinite = 0;
#pragma unroll Unroll
    for (int s0 = 0; s0 < Slots; s0 += Vec) {
      if (Generic && s0 >= ns) break;
      const int e0 = expert(s0);
      float raw[Vec];
      if (Vec > 1 && a.vector_loads && in_row(s0 + Vec - 1)) {
        load_elements<Element, Vec>(row + e0, raw);
      } else {
#pragma unroll
        for (int i = 0; i < Vec; ++i)
          raw[i] = in_row(s0 + i) ? load_element(row + e0 + i) : -FLT_MAX;
      }
#pragma unroll
      for (int i = 0; i < Vec; ++i) {
        if (in_row(s0 + i) && !isfinite(raw[i])) ++nonfinite;
        x[s0 + i] = gating_math::sanitize(raw[i]);
      }
    }
    return warp::group_sum<Lanes>(nonfinite);
  }

  /// A row's max and its sum of exp(v - max) (float exps, the sum in double): the softmax's
  /// denominator and the logsumexp's.
  struct exp_sum {
    float max;
    double sum;
  };

  /// exp(v - max) over the in-range slots of v, in place (0 elsewhere), and their sum in double
  /// (each lane's slots in order, then the fixed butterfly).
  __device__ __forceinline__ exp_sum exps(float (&v)[Slots]) const {
    float m = -FLT_MAX;
    for_slots([&](int s) {
      if (in_row(s)) m = fmaxf(m, v[s]);
    });
    m = warp::group_max<Lanes>(m);
    double sum = 0.0;
    for_slots([&](int s) {
      if (in_row(s)) {
        v[s] = gating_math::exp_f(__fsub_rn(v[s], m));
        sum += static_cast<double>(v[s]);
      } else {
        v[s] = 0.0f;
      }
    });
    return {m, warp::group_sum<Lanes>(sum)};
  }

  /// logsumexp = float(max + log(sum)) of an exp_sum (the CPU backend's formula: the exps are
  /// floats, the reference's doubles; within its 1e-5).
  static __device__ __forceinline__ float logsumexp(exp_sum e) {
    return static_cast<float>(static_cast<double>(e.max) + log(e.sum));
  }

  /// logsumexp of the clean logits, where no softmax of them makes its exps (!lse_from_scores()).
  __device__ __forceinline__ float logsumexp() const {
    float e[Slots];
    for_slots([&](int s) { e[s] = x[s]; });
    return logsumexp(exps(e));
  }

  /// softmax over the in-range slots of v, in place: float(e * (1 / sum)) in double, one
  /// division a lane (the CPU backend's rounding); returns the exp_sum.
  __device__ __forceinline__ exp_sum softmax(float (&v)[Slots]) const {
    const exp_sum e = exps(v);
    const double inv = 1.0 / e.sum;
    for_slots([&](int s) { v[s] = static_cast<float>(static_cast<double>(v[s]) * inv); });
    return e;
  }

  /// The score function over the row, in place; a softmax's exp_sum (else max 0, sum 1).
  __device__ __forceinline__ exp_sum scores(float (&v)[Slots]) const {
    if (sem.score == score_function::softmax) return softmax(v);
    for_slots([&](int s) { v[s] = gating_math::score_one(sem.score, v[s]); });
    return {0.0f, 1.0};
  }

  /// True when noise_and_scores takes the softmax of the clean logits as the gate scores: its
  /// exp_sum is then the logsumexp's (the same max, exps and sum), which is taken from it.
  __device__ __forceinline__ bool lse_from_scores() const {
    return sem.score == score_function::softmax && !sem.softmax_after &&
           !(sem.noise && sem.noisy_gates);
  }

  // --- 2 and 3. noise, gate scores, selection values ------------------------------------------

  /// Noise, gate scores and selection values; returns the gate scores' exp_sum (a softmax of
  /// the clean logits where lse_from_scores(); else max 0, sum 1).
  __device__ __forceinline__ exp_sum noise_and_scores(std::int64_t t) {
    for_slots([&](int s) {
      sel[s] = x[s];
      if (sem.noise && in_row(s)) {
        const float z =
            rng::gating_noise(sem.noise_seed, sem.noise_offset, sem.gaussian, t, E, expert(s));
        sel[s] = gating_math::sanitize(__fadd_rn(x[s], __fmul_rn(sem.noise_scale, z)));
      }
      gsrc[s] = sem.noisy_gates ? sel[s] : x[s];
    });
    exp_sum gate_exps{0.0f, 1.0};
    if (!sem.softmax_after) gate_exps = scores(gsrc);
    if (sem.select_scores) {
      if (sem.noise && !sem.noisy_gates) {
        scores(sel);
      } else {
        for_slots([&](int s) { sel[s] = gsrc[s]; });
      }
    }
    allowed.clear();
    for_slots([&](int s) {
      if (in_row(s)) {
        if (a.bias != nullptr)
          sel[s] = gating_math::sanitize(__fadd_rn(sel[s], __ldg(a.bias + expert(s))));
        if (sem.groups <= 1) allowed.set(s);
      }
    });
    return gate_exps;
  }

  // --- 4. group limit ---------------------------------------------------------------------------

  /// Group score = sum (double, descending) of its top group_take selection values; the
  /// group_topk best groups' experts become allowed (ties: the lower group index).
  __device__ __forceinline__ void group_limit() {
    if (groups_by_lanes()) {
      group_limit_by_lanes();
      return;
    }
    // (a range test instead of the division, or a per-slot group array, costs the register
    // kernels 15 registers: E = 128 drops from 3 blocks an SM to 2)
    const auto in_group = [&](int s, int g) { return in_row(s) && expert(s) / sem.per_group == g; };
    for (int g = 0; g < sem.groups; ++g) {
      double gsum = 0.0;
      warp::topk<row_layout, Lanes, Slots, Generic>(
          sel, ns, sem.group_take, [&](int s) { return in_group(s, g); },
          [&](int, float value, int) { gsum += static_cast<double>(value); });
      if (g % Lanes == lane)
        warp::slot_set<Slots, Generic>(rv, g / Lanes, static_cast<float>(gsum));
    }
    // group scores may be +-inf (a double sum beyond the float range): the top-k tests the
    // index, not the value, to tell a candidate from none
    warp::topk<group_layout, Lanes, Slots, Generic>(
        rv, ns, sem.group_topk, [&](int s) { return s * Lanes + lane < sem.groups; },
        [&](int, float, int group) {
          for_slots([&](int s) {
            if (in_group(s, group)) allowed.set(s);
          });
        });
  }

  /// True when group_limit_by_lanes applies: a full register row whose groups are whole runs
  /// of lanes inside one 16-byte block column (E = Lanes * Slots, per_group a multiple of Vec
  /// dividing Lanes * Vec, so each lane's Vec values of a block lie in one group and a group's
  /// lanes are an aligned power-of-two run), scored by its top one or two values (DeepSeek-V3,
  /// Megatron's group-limited routing with k / topk_group <= 2).
  __device__ __forceinline__ bool groups_by_lanes() const {
    if constexpr (Generic) {
      return false;
    } else {
      const int per = sem.per_group;
      return sem.group_take <= 2 && E == Lanes * Slots && per * sem.groups == E && per % Vec == 0 &&
             (Lanes * Vec) % per == 0;
    }
  }

  /// group_limit with no top-n pass per group: each lane keeps the top two of its Vec values
  /// per block, a butterfly over the group's lanes merges them (top two of a multiset: only
  /// values enter the score, and the double sum of two floats is exact in either order, so it
  /// equals the reference's descending sum), and each block's group counts the groups that
  /// beat it (larger score, or equal and lower index): rank < group_topk is kept. A few dozen
  /// instructions a block instead of a top-n pass over the whole row for every group.
  __device__ __forceinline__ void group_limit_by_lanes() {
    constexpr int Blocks = Slots / Vec;
    const int per = sem.per_group;
    const int run = per / Vec;          // lanes of one group in a block (a power of two)
    const int per_block = Lanes / run;  // groups in one block column
    int shift = 0;                      // log2(per_block)
    while ((1 << shift) < per_block) ++shift;
    const bool two = sem.group_take == 2;
    float score[Blocks];
    int mine[Blocks];
#pragma unroll
    for (int b = 0; b < Blocks; ++b) {
      float t1 = -INFINITY, t2 = -INFINITY;
#pragma unroll
      for (int i = 0; i < Vec; ++i) {
        const float v = sel[b * Vec + i];
        t2 = fmaxf(t2, fminf(t1, v));
        t1 = fmaxf(t1, v);
      }
      for (int o = 1; o < run; o <<= 1) {  // the same trip count on every lane
        const float u1 = __shfl_xor_sync(warp::full_mask, t1, o, Lanes);
        const float u2 = __shfl_xor_sync(warp::full_mask, t2, o, Lanes);
        t2 = fmaxf(fmaxf(t2, u2), fminf(t1, u1));
        t1 = fmaxf(t1, u1);
      }
      score[b] = two ? static_cast<float>(static_cast<double>(t1) + static_cast<double>(t2)) : t1;
      mine[b] = (b << shift) + lane / run;
    }
    int rank[Blocks];
#pragma unroll
    for (int b = 0; b < Blocks; ++b) rank[b] = 0;
    for (int h = 0; h < sem.groups; ++h) {
      const float hv =
          __shfl_sync(warp::full_mask, warp::slot_get<Blocks, false>(score, h >> shift),
                      (h & (per_block - 1)) * run, Lanes);
#pragma unroll
      for (int b = 0; b < Blocks; ++b) rank[b] += warp::better(hv, h, score[b], mine[b]) ? 1 : 0;
    }
#pragma unroll
    for (int s = 0; s < Slots; ++s)
      if (rank[s / Vec] < sem.group_topk) allowed.set(s);
  }

  // --- 4b. NLLB second-expert sampling -------------------------------------------------------

  /// The first choice stays (pinned to FLT_MAX), every other eligible expert competes with
  /// x_e + Gumbel(t, e) for the second place (reference::gating, step 4b).
  __device__ __forceinline__ void sample_second(std::int64_t t) {
    int first = -1;
    warp::topk<row_layout, Lanes, Slots, Generic>(
        sel, ns, 1, [&](int s) { return allowed.test(s); },
        [&](int, float, int best) { first = best; });
    for_slots([&](int s) {
      if (!in_row(s)) return;
      if (expert(s) == first) {
        sel[s] = FLT_MAX;
        return;
      }
      sel[s] = gating_math::sanitize(__fadd_rn(
          x[s], rng::second_expert_gumbel(sem.second_seed, sem.second_offset, t, E, expert(s))));
    });
  }

  // --- 5 and 6. top-(k + R) and the gates ------------------------------------------------------

  /// Ranks k + R experts; rank j < k goes to (ri, rv) of lane j % Lanes (the expert and its gate
  /// source value), ranks >= k to the reroute candidates of token t. Then the gates. Consumes
  /// sel (nothing reads it again before aux_scores writes P there).
  __device__ __forceinline__ void select_and_gate(std::int64_t t, bool active) {
    float gate_sum = 0.0f;  // in rank order, as the reference
    float chosen_max = -FLT_MAX;
    float second_score = 0.0f;  // p2 of NLLB's "random" policy: the rank-1 gate source
    for_slots([&](int s) {
      if (!allowed.test(s)) sel[s] = -INFINITY;  // (selection values are >= -FLT_MAX)
    });
    warp::topk_take<row_layout, Lanes, Slots, Generic>(
        sel, ns, sem.k + sem.reroute, [&](int j, float, int best) {
          const float gv = row_value(gsrc, best);
          if (j < sem.k) {
            if (j < Lanes) {  // slot 0: no select chain over the slots (k <= Lanes: always)
              if (j == lane) {
                ri[0] = best;
                rv[0] = gv;
              }
            } else if (j % Lanes == lane) {
              warp::slot_set<Slots, Generic>(ri, j / Lanes, best);
              warp::slot_set<Slots, Generic>(rv, j / Lanes, gv);
            }
            gate_sum = __fadd_rn(gate_sum, gv);
            chosen_max = fmaxf(chosen_max, gv);
            if (j == 1) second_score = gv;
          } else if (active && lane == 0) {
            a.out.d_reroute_ids[t * sem.reroute + (j - sem.k)] = best;
          }
        });
    gates(t, active, gate_sum, chosen_max, second_score);
  }

  /// v[expert e] of the row, on every lane of the group (from the lane that owns it).
  __device__ __forceinline__ float row_value(const float (&v)[Slots], int e) const {
    const float mine = warp::slot_get<Slots, Generic>(v, row_layout::owner_slot(e));
    return __shfl_sync(warp::full_mask, mine, row_layout::owner_lane(e), Lanes);
  }

  /// The expert of rank (slot) j, on every lane of the group.
  __device__ __forceinline__ int ranked(int j) const {
    return __shfl_sync(warp::full_mask, warp::slot_get<Slots, Generic>(ri, j / Lanes), j % Lanes,
                       Lanes);
  }

  /// The replay filter's value of expert e (moeroute/replay.hpp): its clean logit for softmax,
  /// else its score.
  __device__ __forceinline__ float replay_value(int e) const {
    const float xv = row_value(x, e);
    return sem.score == score_function::softmax ? xv : gating_math::score_one(sem.score, xv);
  }

  /// Step 5 under replay (moeroute/replay.hpp): the replayed ids in their slots, the best others
  /// by the config's rule in the rest, then the R candidates; the gates as select_and_gate.
  /// Adds the slots the filter gave back (valid tokens) to `replaced` and the ids taken as -1
  /// (out of [-1, E) or repeated) to `invalid`, on lane 0.
  /// Every shuffle runs the same number of times in every group of a warp (groups of fewer than
  /// 32 lanes share one): loop counts are k, k + R and the config's, never a token's.
  __device__ __forceinline__ void replay_select_and_gate(std::int64_t t, bool active, bool counts,
                                                         int& replaced, int& invalid) {
    const std::int32_t* r = a.replay.d_ids + t * sem.k;
    const float ratio = a.replay.min_score_ratio;
    const bool softmax = sem.score == score_function::softmax;
    float weakest = FLT_MAX;  // the weakest filter value of the router's own top-k
    if (ratio > 0.0f)
      warp::topk<row_layout, Lanes, Slots, Generic>(
          sel, ns, sem.k, [&](int s) { return allowed.test(s); },
          [&](int, float, int best) { weakest = fminf(weakest, replay_value(best)); });
    // slots the router fills: the i-th of them is rv's rank i (as a float, exact: j < 2^24),
    // rv being free until the gates (no register array of its own next to the row's)
    int open = 0;
    for (int j = 0; j < sem.k; ++j) {
      int e = r[j];
      bool ok = e >= -1 && e < E;
      for (int i = 0; i < j && ok && e >= 0; ++i) ok = r[i] != e;
      if (!ok) {
        if (active && lane == 0) ++invalid;
        e = -1;
      }
      const float value = ratio > 0.0f ? replay_value(e >= 0 ? e : 0) : 0.0f;
      bool kept = e >= 0;
      if (kept && ratio > 0.0f) {
        kept = replay_keeps(softmax, value, weakest, ratio, a.replay_log_ratio);
        if (!kept && counts && lane == 0) ++replaced;
      }
      if (kept && row_layout::owner_lane(e) == lane) allowed.reset(row_layout::owner_slot(e));
      if (j % Lanes == lane) warp::slot_set<Slots, Generic>(ri, j / Lanes, kept ? e : -1);
      if (!kept) {
        if (open % Lanes == lane)
          warp::slot_set<Slots, Generic>(rv, open / Lanes, static_cast<float>(j));
        ++open;
      }
    }
    warp::topk<row_layout, Lanes, Slots, Generic>(
        sel, ns, sem.k + sem.reroute, [&](int s) { return allowed.test(s); },
        [&](int i, float, int best) {
          const float fj = __shfl_sync(
              warp::full_mask, warp::slot_get<Slots, Generic>(rv, i / Lanes), i % Lanes, Lanes);
          if (i < open) {
            const int j = static_cast<int>(fj);
            if (j % Lanes == lane) warp::slot_set<Slots, Generic>(ri, j / Lanes, best);
          } else if (i - open < sem.reroute && active && lane == 0) {
            a.out.d_reroute_ids[t * sem.reroute + (i - open)] = best;
          }
        });
    float gate_sum = 0.0f;  // in slot order, as the reference
    float chosen_max = -FLT_MAX;
    float second_score = 0.0f;
    for (int j = 0; j < sem.k; ++j) {
      const float gv = row_value(gsrc, ranked(j));
      if (j % Lanes == lane) warp::slot_set<Slots, Generic>(rv, j / Lanes, gv);
      gate_sum = __fadd_rn(gate_sum, gv);
      chosen_max = fmaxf(chosen_max, gv);
      if (j == 1) second_score = gv;
    }
    gates(t, active, gate_sum, chosen_max, second_score);
  }

  /// The gates of the k chosen (rv: their gate sources, in slot order) and NLLB's draw.
  __device__ __forceinline__ void gates(std::int64_t t, bool active, float gate_sum,
                                        float chosen_max, float second_score) {
    if (sem.second_random && active && lane == 0) {
      const float u = rng::second_expert_uniform(sem.second_seed, sem.second_offset, t);
      a.out.d_second_skipped[t] = __fmul_rn(2.0f, second_score) > u ? 0 : 1;
    }
    if (sem.softmax_after) {
      for_slots([&](int s) {
        if (s * Lanes + lane < sem.k) rv[s] = gating_math::exp_f(__fsub_rn(rv[s], chosen_max));
      });
      double sum = 0.0;  // rank order, as the reference's softmax_row
      for (int s = 0; s < ns && s * Lanes < sem.k; ++s) {
        const float mine = warp::slot_get<Slots, Generic>(rv, s);
        for (int l = 0; l < Lanes && s * Lanes + l < sem.k; ++l)
          sum += static_cast<double>(__shfl_sync(warp::full_mask, mine, l, Lanes));
      }
      for_slots([&](int s) {
        if (s * Lanes + lane < sem.k) rv[s] = static_cast<float>(static_cast<double>(rv[s]) / sum);
      });
    } else if (sem.before_drop) {
      const float denom = __fadd_rn(gate_sum, sem.renorm_epsilon);
      ranked_slots([&](int s) { rv[s] = denom > 0.0f ? __fdiv_rn(rv[s], denom) : 0.0f; });
    }
    if (!sem.after_drop) ranked_slots([&](int s) { rv[s] = __fmul_rn(rv[s], sem.scaling); });
  }

  /// f(s) for the slots that hold ranks (s * Lanes < k: slot 0 alone for k <= Lanes), a
  /// condition the same on every lane of the group; the other slots' values are never read
  /// (a division each was ~10 instructions: 7 of them a token for DeepSeek-V3's 8 slots).
  template <class F>
  __device__ __forceinline__ void ranked_slots(F&& f) const {
    for_slots([&](int s) {
      if (s * Lanes < sem.k) f(s);
    });
  }

  /// Writes token t's ids, gates and logsumexp (when asked for).
  __device__ __forceinline__ void write(std::int64_t t, float lse) const {
    for_slots([&](int s) {
      const int j = s * Lanes + lane;
      if (j < sem.k) {
        a.out.d_ids[t * sem.k + j] = ri[s];
        a.out.d_gates[t * sem.k + j] = rv[s];
      }
    });
    if (lane == 0 && a.out.d_logsumexp != nullptr) a.out.d_logsumexp[t] = lse;
  }

  // --- 7. aux-loss inputs ---------------------------------------------------------------------

  /// sel := P, the softmax of the clean logits or the normalised clean scores.
  __device__ __forceinline__ void aux_scores() {
    const bool gsrc_is_clean_scores = !sem.noisy_gates && !sem.softmax_after;
    for_slots([&](int s) { sel[s] = gsrc_is_clean_scores ? gsrc[s] : x[s]; });
    if (sem.score == score_function::softmax) {
      if (!gsrc_is_clean_scores) softmax(sel);
      return;
    }
    float ssum = 0.0f;
    for_slots([&](int s) {
      if (!gsrc_is_clean_scores) sel[s] = gating_math::score_one(sem.score, sel[s]);
      if (in_row(s)) ssum = __fadd_rn(ssum, sel[s]);
    });
    const float denom = __fadd_rn(warp::group_sum<Lanes>(ssum), 1e-20f);
    for_slots([&](int s) { sel[s] = __fdiv_rn(sel[s], denom); });
  }

  /// The token's batch priority (reference::gating_output::token_priority): the largest P for
  /// softmax (call after aux_scores), score(max logit) for the per-expert score functions.
  __device__ __forceinline__ float priority() const {
    float v = -FLT_MAX;
    if (sem.score == score_function::softmax) {
      for_slots([&](int s) {
        if (in_row(s)) v = fmaxf(v, sel[s]);
      });
      v = warp::group_max<Lanes>(v);
    } else {
      for_slots([&](int s) { v = fmaxf(v, x[s]); });  // out-of-range slots hold -FLT_MAX
      v = gating_math::score_one(sem.score, warp::group_max<Lanes>(v));
    }
    return v;
  }

  /// count(j, e) for each expert e the token counts for in the aux loss, j its rank: its routed
  /// top-1 or top-k, or a fresh top-`counted` of P over every expert (no bias, no group limit).
  /// The last reader of P: a fresh top-k consumes it.
  template <class Count>
  __device__ __forceinline__ void aux_counts(bool counts_here, Count&& count) {
    if (sem.fresh_counts) {
      for_slots([&](int s) {
        if (!in_row(s)) sel[s] = -INFINITY;  // (P is in [0, 1])
      });
      warp::topk_take<row_layout, Lanes, Slots, Generic>(sel, ns, sem.counted,
                                                         [&](int j, float, int best) {
                                                           if (counts_here && lane == 0)
                                                             count(j, best);
                                                         });
    } else if (counts_here) {
      for_slots([&](int s) {
        const int j = s * Lanes + lane;
        if (j < sem.counted) count(j, ri[s]);
      });
    }
  }

  /// The optional per-token outputs (gating_result::d_aux_scores, d_aux_count_ids) of token t,
  /// when the rows are not counted (padding): zeros and -1.
  __device__ __forceinline__ void write_uncounted(std::int64_t t) const {
    if (a.out.d_aux_scores != nullptr)
      for_slots([&](int s) {
        if (in_row(s)) a.out.d_aux_scores[t * E + expert(s)] = 0.0f;
      });
    if (a.out.d_aux_count_ids != nullptr)
      for (int j = lane; j < sem.counted; j += Lanes)
        a.out.d_aux_count_ids[t * sem.counted + j] = -1;
  }

  /// Token t's P row (after aux_scores) into gating_result::d_aux_scores, when given.
  __device__ __forceinline__ void write_aux_scores(std::int64_t t) const {
    if (a.out.d_aux_scores != nullptr)
      for_slots([&](int s) {
        if (in_row(s)) a.out.d_aux_scores[t * E + expert(s)] = sel[s];
      });
  }
};

}  // namespace moeroute::kernels
