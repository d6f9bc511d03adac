// SPDX-License-Identifier: Apache-2.0
// The expert-parallel scenarios and hostile cases, one list for every harness: the loopback
// tests run them for R = 1..4 in threads, the MPI harness for the R it was started with.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ep_oracle.hpp"

namespace moeroute::test::ep_oracle {

/// Tokens per rank for R ranks: uneven, with empty ranks from R = 2 on.
inline std::vector<std::int64_t> uneven_tokens(std::int32_t R) {
  static const std::int64_t pattern[] = {5, 0, 9, 3, 7, 0, 4, 6};
  if (R == 1) return {11};
  std::vector<std::int64_t> t(R);
  for (std::int32_t r = 0; r < R; ++r) t[r] = pattern[r % 8];
  return t;
}

/// Scenarios whose result must equal the single-device oracle bit for bit. E = 7 is not a
/// multiple of any R > 1; k = 3 exceeds the experts on one rank for R = 3, 4; the hot expert
/// E - 1 sits on the last rank of the contiguous placement; every 4th token is padding.
inline std::vector<scenario> scenarios(std::int32_t R) {
  std::vector<scenario> out;
  const auto base = [&](const char* name, ep::capacity_scope scope) {
    scenario s;
    s.name = name;
    s.cfg.num_experts = 7;
    s.cfg.top_k = 3;
    s.cfg.capacity.factor = 1.0;
    s.opt.scope = scope;
    s.tokens = uneven_tokens(R);
    s.hot_expert = 6;
    s.padding_every = 4;
    return s;
  };
  {
    auto s = base("dropless", ep::capacity_scope::dropless);
    out.push_back(s);
  }
  {
    auto s = base("dropless compact block 4, table placement", ep::capacity_scope::dropless);
    s.opt.block_size = 4;
    s.placement = "reversed";
    s.seed = 2;
    out.push_back(s);
  }
  {
    auto s = base("dropless worst case, padded", ep::capacity_scope::dropless_worst_case);
    s.opt.worst_case_tokens = 12;
    s.opt.receive_layout = layout_kind::padded;
    out.push_back(s);
  }
  {
    auto s = base("global token_major", ep::capacity_scope::global);
    s.cfg.top_k = 2;
    out.push_back(s);
  }
  {
    auto s =
        base("global choice_major, token slots, residual, round robin", ep::capacity_scope::global);
    s.cfg.dispatch.prio = priority::choice_major;
    s.cfg.dispatch.slots = slot_order::token_index;
    s.cfg.dispatch.dropped = drop_policy::residual;
    s.cfg.capacity.factor = 0.75;
    s.placement = "round_robin";
    s.seed = 3;
    out.push_back(s);
  }
  {
    auto s = base("global after-drop renorm, padded", ep::capacity_scope::global);
    s.cfg.gating.renorm = renormalize::after_drop;
    s.cfg.gating.scaling_factor = 2.5f;
    s.opt.receive_layout = layout_kind::padded;
    s.seed = 4;
    out.push_back(s);
  }
  {
    auto s = base("global max_load (dropless by capacity)", ep::capacity_scope::global);
    s.cfg.capacity.mode = capacity_mode::max_load;
    out.push_back(s);
  }
  {
    auto s = base("per_source, dedicated fallback", ep::capacity_scope::per_source);
    s.cfg.capacity.factor = 0.5;
    s.cfg.dispatch.dropped = drop_policy::fallback;
    s.seed = 5;
    out.push_back(s);
  }
  {
    auto s = base("per_source next_choice, padded", ep::capacity_scope::per_source);
    s.cfg.capacity.factor = 0.6;
    s.cfg.dispatch.dropped = drop_policy::next_choice;
    s.cfg.dispatch.reroute.max_candidates = 2;
    s.opt.receive_layout = layout_kind::padded;
    s.seed = 6;
    out.push_back(s);
  }
  return out;
}

/// One named check that runs on every rank and returns its failures.
struct check {
  std::string name;
  std::function<std::vector<std::string>(ep::transport&)> run;
};

/// Every check of the expert-parallel suite for R ranks: the scenarios in f32 and bf16, the
/// adjointness in double, and the hostile inputs.
inline std::vector<check> all_checks(std::int32_t R) {
  std::vector<check> out;
  for (const auto& s : scenarios(R)) {
    out.push_back({s.name + " [f32]", [s](ep::transport& t) { return run_layer<float>(t, s); }});
    out.push_back(
        {s.name + " [bf16]", [s](ep::transport& t) { return run_layer<bf16_bits>(t, s); }});
  }
  out.push_back(
      {"adjoint dropless", [R](ep::transport& t) { return run_adjoint(t, scenarios(R)[0]); }});
  out.push_back({"adjoint per_source fallback",
                 [R](ep::transport& t) { return run_adjoint(t, scenarios(R)[7]); }});
  out.push_back({"combine adjoint dropless",
                 [R](ep::transport& t) { return run_combine_adjoint(t, scenarios(R)[0]); }});
  out.push_back({"combine adjoint per_source fallback",
                 [R](ep::transport& t) { return run_combine_adjoint(t, scenarios(R)[7]); }});

  const scenario s0 = scenarios(R)[3];
  // Runs layout + plan for scenario s on this rank, with hooks to spoil one rank's inputs.
  const auto plan_with = [](ep::transport& t, scenario s,
                            const std::function<void(reference::gating_output&)>& spoil_gating,
                            std::int64_t hidden) {
    rank_routing rr = route_rank(s, t.ranks(), t.rank());
    if (spoil_gating) {
      spoil_gating(rr.g);
      rr.layout = ep::local_dispatch(s.cfg, rr.place, s.opt, t.rank(), rr.g);
    }
    return ep::make_plan(t, s.cfg, rr.place, s.opt, rr.layout, hidden, sizeof(float));
  };
  const auto last = [](ep::transport& t) { return t.rank() == t.ranks() - 1; };

  out.push_back({"hostile: ranks disagree on top_k", [=](ep::transport& t) {
                   scenario s = s0;
                   if (last(t) && t.ranks() > 1) s.cfg.top_k = 1;
                   if (t.ranks() == 1) return std::vector<std::string>{};
                   return expect_error_everywhere(
                       t, "disagree", [&] { (void)plan_with(t, s, {}, 4); },
                       status_code::communication_error, {"routing config"});
                 }});
  out.push_back({"hostile: ranks disagree on hidden", [=](ep::transport& t) {
                   if (t.ranks() == 1) return std::vector<std::string>{};
                   return expect_error_everywhere(
                       t, "hidden", [&] { (void)plan_with(t, s0, {}, last(t) ? 5 : 4); },
                       status_code::communication_error, {"hidden size"});
                 }});
  out.push_back({"hostile: duplicate id on the last rank", [=](ep::transport& t) {
                   scenario s = s0;
                   s.tokens.back() = std::max<std::int64_t>(s.tokens.back(), 2);
                   const auto spoil = [&](reference::gating_output& g) {
                     if (last(t) && g.tokens > 0) g.ids[1] = g.ids[0];
                   };
                   return expect_error_everywhere(
                       t, "duplicate", [&] { (void)plan_with(t, s, spoil, 4); },
                       status_code::invalid_argument,
                       {"rank " + std::to_string(t.ranks() - 1), "names that expert twice"});
                 }});
  out.push_back({"hostile: id out of range on the last rank", [=](ep::transport& t) {
                   scenario s = s0;
                   s.tokens.back() = std::max<std::int64_t>(s.tokens.back(), 2);
                   const auto spoil = [&](reference::gating_output& g) {
                     if (last(t) && g.tokens > 0) g.ids[0] = 7;
                   };
                   return expect_error_everywhere(
                       t, "out of range", [&] { (void)plan_with(t, s, spoil, 4); },
                       status_code::invalid_argument, {"gating_output.ids[0] = 7", "outside"});
                 }});
  out.push_back({"hostile: worst case exceeded on the first rank", [=](ep::transport& t) {
                   scenario s = s0;
                   s.opt.scope = ep::capacity_scope::dropless_worst_case;
                   s.opt.worst_case_tokens = 4;
                   s.tokens[0] = 5;
                   return expect_error_everywhere(
                       t, "worst case", [&] { (void)plan_with(t, s, {}, 4); },
                       status_code::invalid_argument, {"rank 0", "options.worst_case_tokens = 4"});
                 }});
  out.push_back(
      {"hostile: receive budget overflow is an error with the true count", [=](ep::transport& t) {
         scenario s = s0;
         s.opt.scope = ep::capacity_scope::destination_budget;
         s.opt.receive_budget = 1;
         return expect_error_everywhere(t, "budget", [&] { (void)plan_with(t, s, {}, 4); },
                                        status_code::invalid_argument,
                                        {"would receive", "options.receive_budget = 1"});
       }});
  out.push_back(
      {"hostile: a too-small buffer on the last rank", [=](ep::transport& t) {
         return expect_error_everywhere(
             t, "buffer",
             [&] {
               const auto p = plan_with(t, s0, {}, 4);
               std::vector<float> x(p.tokens * 4), recv(p.receive_rows * 4 + (last(t) ? 1 : 0));
               std::vector<std::byte> ws(ep::workspace_bytes(p));
               ep::dispatch<float>(t, p, x, recv, ws);
             },
             status_code::invalid_shape, {"rank " + std::to_string(t.ranks() - 1), "received has"});
       }});
  out.push_back(
      {"budget drop_tail keeps the first rows and reports the true count", [=](ep::transport& t) {
         report rep;
         rep.where = "drop_tail rank " + std::to_string(t.rank());
         scenario s = s0;
         s.opt.scope = ep::capacity_scope::destination_budget;
         s.opt.overflow = ep::overflow_policy::drop_tail;
         s.opt.receive_budget = 4;
         const auto p = plan_with(t, s, {}, 4);
         std::int64_t over = 0;
         for (std::int32_t r = 0; r < t.ranks(); ++r) {
           if (p.received_by(r) > s.opt.receive_budget) rep.fail("budget exceeded");
           if (p.received_by(r) != std::min(p.required_rows[r], s.opt.receive_budget))
             rep.fail("rank " + std::to_string(r) + " kept fewer rows than the budget allows");
           over += p.required_rows[r] - p.received_by(r);
         }
         if (over == 0) rep.fail("scenario does not overflow: test checks nothing");
         if (p.dropped() != over) rep.fail("dropped() != true count - received");
         const auto& dsp = p.decision;
         if (dsp.total_kept + dsp.total_dropped + dsp.total_masked != dsp.tokens * dsp.k)
           rep.fail("an assignment was lost");
         return rep.failures;
       }});
  return out;
}

}  // namespace moeroute::test::ep_oracle
