// SPDX-License-Identifier: Apache-2.0
// An expert-parallel MoE layer on CPU processes: 8 experts (d = 16 -> 32 -> 16 ReLU FFNs) on
// 4 ranks, top-2, global capacity 1.25. Routing, dispatch, the experts, combine, one backward
// step and an SGD update; prints per-rank counts and the hotspot factor, and checks the
// layer's output against each rank computing its own tokens densely (every rank can build
// every expert from the seed). Copy it as a template.
//
//   mpiexec -n 4 ./example_ep_mpi          (as root add --allow-run-as-root)
#include <cmath>
#include <cstdio>
#include <vector>

#include <moeroute/ep.hpp>
#include <moeroute/ep/mpi.hpp>
#include <moeroute/reference.hpp>

namespace ep = moeroute::ep;

constexpr int E = 8, K = 2, D = 16, H = 32;

// One expert's FFN: y = W2 relu(W1 x). Weights are data of the rank that owns the expert.
struct expert {
  std::vector<float> w1 = std::vector<float>(H * D), w2 = std::vector<float>(D * H);
  explicit expert(int e) {
    unsigned s = 1234u + 77u * static_cast<unsigned>(e);
    auto next = [&] {
      s = s * 1664525u + 1013904223u;
      return (float((s >> 8) & 0xffff) / 65536.0f - 0.5f) * 0.5f;
    };
    for (auto& v : w1) v = next();
    for (auto& v : w2) v = next();
  }
  void forward(const float* x, float* hidden, float* y) const {
    for (int i = 0; i < H; ++i) {
      float a = 0;
      for (int c = 0; c < D; ++c) a += w1[i * D + c] * x[c];
      hidden[i] = a > 0 ? a : 0;
    }
    for (int o = 0; o < D; ++o) {
      float a = 0;
      for (int i = 0; i < H; ++i) a += w2[o * H + i] * hidden[i];
      y[o] = a;
    }
  }
  // Accumulates dW1, dW2 and writes dx for one row.
  void backward(const float* x, const float* hidden, const float* dy, float* dx,
                std::vector<float>& g1, std::vector<float>& g2) const {
    float dh[H];
    for (int i = 0; i < H; ++i) {
      float a = 0;
      for (int o = 0; o < D; ++o) {
        a += w2[o * H + i] * dy[o];
        g2[o * H + i] += dy[o] * hidden[i];
      }
      dh[i] = hidden[i] > 0 ? a : 0;
    }
    for (int c = 0; c < D; ++c) {
      float a = 0;
      for (int i = 0; i < H; ++i) {
        a += w1[i * D + c] * dh[i];
        g1[i * D + c] += dh[i] * x[c];
      }
      dx[c] = a;
    }
  }
};

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    ep::mpi_transport t(MPI_COMM_WORLD);
    const int me = t.rank(), R = t.ranks();
    // Uneven batches; the last rank of four has none and still takes part in every exchange.
    const std::int64_t T = me == 3 ? 0 : 48 + 8 * me;

    moeroute::routing_config cfg;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.gating.renorm = moeroute::renormalize::before_drop;
    cfg.capacity.factor = 1.25;
    ep::options opt;
    opt.scope = ep::capacity_scope::global;  // drops equal one device routing all 4 batches
    const auto place = ep::placement::contiguous(E, R);

    // Router logits and hidden states of this rank's tokens (skewed toward expert 7).
    std::vector<float> logits(T * E), x(T * D);
    unsigned s = 99u + 17u * static_cast<unsigned>(me);
    auto rnd = [&] {
      s = s * 1664525u + 1013904223u;
      return float((s >> 8) & 0xffff) / 65536.0f - 0.5f;
    };
    for (std::int64_t i = 0; i < T * E; ++i) logits[i] = 4.0f * rnd() + (i % E == 7 ? 1.5f : 0.0f);
    for (auto& v : x) v = rnd();

    // [snippet:ep-layer]
    // Phases: routing (local), layout (local), plan (the one counts exchange).
    const auto g = moeroute::reference::gating(cfg, logits, T);
    const auto layout = ep::local_dispatch(cfg, place, opt, me, g);
    const ep::plan p = ep::make_plan(t, cfg, place, opt, layout, D, sizeof(float));
    std::vector<std::byte> ws(ep::workspace_bytes(p));

    // This rank's experts.
    std::vector<expert> experts;
    for (int l = 0; l < p.segments(); ++l) experts.emplace_back(p.segment_expert[l]);

    std::vector<float> recv(p.receive_rows * D), hidden(p.receive_rows * H),
        out(p.receive_rows * D);
    std::vector<float> returned(p.send_total() * D), y(T * D);
    const auto layer = [&] {
      ep::dispatch<float>(t, p, x, recv, ws);
      for (int l = 0; l < p.segments(); ++l)
        for (std::int64_t r = p.segment_offsets[l]; r < p.segment_offsets[l] + p.segment_used[l];
             ++r)
          experts[l].forward(&recv[r * D], &hidden[r * H], &out[r * D]);
      ep::combine<float>(t, p, out, x, returned, y, ws);
    };
    // [/snippet]
    const auto loss = [&] {  // L = 1/2 |y|^2 summed over every rank's tokens
      double l = 0, total = 0;
      for (float v : y) l += 0.5 * double(v) * v;
      MPI_Allreduce(&l, &total, 1, MPI_DOUBLE, MPI_SUM, t.comm());
      return total;
    };
    layer();
    const double loss0 = loss();

    // Check: every token's output against a dense computation of the same routing.
    for (std::int64_t tk = 0; tk < T; ++tk) {
      float acc[D] = {}, h[H], o[D];
      for (int j = 0; j < K; ++j) {
        const std::int64_t a = tk * K + j;
        if (p.decision.expert[a] < 0) continue;
        expert(p.decision.expert[a]).forward(&x[tk * D], h, o);
        for (int c = 0; c < D; ++c) acc[c] += p.decision.weight[a] * o[c];
      }
      for (int c = 0; c < D; ++c) bad += acc[c] != y[tk * D + c];
    }

    // One backward step: dL/dy = y through combine, the experts and dispatch; SGD on experts.
    std::vector<float> d_out(p.receive_rows * D), d_recv(p.receive_rows * D), d_w(T * K),
        d_x(T * D);
    ep::combine_backward<float>(t, p, returned, y, d_out, d_w, d_x, ws);
    for (int l = 0; l < p.segments(); ++l) {
      std::vector<float> g1(H * D, 0.0f), g2(D * H, 0.0f);
      for (std::int64_t r = p.segment_offsets[l]; r < p.segment_offsets[l] + p.segment_used[l]; ++r)
        experts[l].backward(&recv[r * D], &hidden[r * H], &d_out[r * D], &d_recv[r * D], g1, g2);
      for (int i = 0; i < H * D; ++i) experts[l].w1[i] -= 0.05f * g1[i];
      for (int i = 0; i < D * H; ++i) experts[l].w2[i] -= 0.05f * g2[i];
    }
    ep::dispatch_backward<float>(t, p, d_recv, d_x, ws, /*accumulate=*/true);
    layer();  // the same plan, reused
    const double loss1 = loss();

    std::printf(
        "rank %d: tokens %lld, sent %lld rows (%lld to other ranks), received %lld, "
        "dropped %lld of its assignments\n",
        me, static_cast<long long>(T), static_cast<long long>(p.send_total()),
        static_cast<long long>(p.send_total() - p.send_rows[me]),
        static_cast<long long>(p.recv_total()), static_cast<long long>(p.dropped_by_rank[me]));
    MPI_Barrier(t.comm());
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, t.comm());
    if (me == 0) {
      std::printf(
          "global capacity C = %lld over %lld tokens; hotspot factor %.2f; %lld rows "
          "cross ranks; %lld assignments dropped\n",
          static_cast<long long>(p.capacity), static_cast<long long>(p.global_tokens), p.hotspot(),
          static_cast<long long>(p.crossing_rows()), static_cast<long long>(p.dropped()));
      std::printf("loss %.6f -> %.6f after one SGD step on the experts\n", loss0, loss1);
      if (any || !(loss1 < loss0)) {
        std::printf("MISMATCH: %d outputs differ from the dense computation%s\n", any,
                    loss1 < loss0 ? "" : ", loss did not fall");
      } else {
        std::printf("OK\n");
      }
    }
    bad = any || !(loss1 < loss0);
  }
  MPI_Finalize();
  return bad ? 1 : 0;
}
