// SPDX-License-Identifier: Apache-2.0
// params rebind<To>(): every field of a params struct survives the change of element type
// (half_bits -> a 2-byte stand-in for __half), and the element pointers keep their addresses.
#include <catch2/catch.hpp>

#include <cstdint>

#include <moeroute/dtype.hpp>
#include <moeroute/params/combine.hpp>
#include <moeroute/params/combine_backward.hpp>
#include <moeroute/params/gating.hpp>
#include <moeroute/params/gating_backward.hpp>
#include <moeroute/params/permute.hpp>
#include <moeroute/params/permute_backward.hpp>

namespace moeroute::test {
namespace {

struct other_half {  // the device type's stand-in: same size, another type
  std::uint16_t bits;
};

template <class T>
T* at(std::uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

TEST_CASE("params rebind keeps every field", "[params]") {
  std::int64_t num_rows = 0;
  const_layout_result lay;
  lay.d_assignment_row = at<const std::int64_t>(0x1000);
  lay.d_row_token = at<const std::int32_t>(0x1100);
  lay.d_num_rows = &num_rows;
  const_dispatch_result dsp;
  dsp.d_weight = at<const float>(0x1200);
  dsp.d_fate = at<const fate>(0x1300);

  gating_params<half_bits> g;
  g.d_logits = at<const half_bits>(0x2000);
  g.tokens = 7;
  g.d_bias = at<const float>(0x2100);
  g.d_valid = at<const std::uint8_t>(0x2200);
  g.out.d_ids = at<std::int32_t>(0x2300);
  g.out.sums.d_z_sum_squares = at<double>(0x2400);
  const auto g2 = rebind<other_half>(g);
  REQUIRE(reinterpret_cast<std::uintptr_t>(g2.d_logits) == 0x2000);
  REQUIRE((g2.tokens == 7 && g2.d_bias == g.d_bias && g2.d_valid == g.d_valid));
  REQUIRE(
      (g2.out.d_ids == g.out.d_ids && g2.out.sums.d_z_sum_squares == g.out.sums.d_z_sum_squares));

  const permute_params<half_bits> p{at<const half_bits>(0x3000), 5, 9, lay, 11,
                                    at<half_bits>(0x3100)};
  const auto p2 = rebind<other_half>(p);
  REQUIRE(reinterpret_cast<std::uintptr_t>(p2.d_x) == 0x3000);
  REQUIRE(reinterpret_cast<std::uintptr_t>(p2.d_out) == 0x3100);
  REQUIRE((p2.tokens == 5 && p2.hidden == 9 && p2.rows == 11));
  REQUIRE((p2.layout.d_row_token == lay.d_row_token && p2.layout.d_num_rows == &num_rows));

  const combine_params<half_bits> c{
      at<const half_bits>(0x4000), 11, 5, 9, lay, dsp, at<const half_bits>(0x4100),
      at<half_bits>(0x4200)};
  const auto c2 = rebind<other_half>(c);
  REQUIRE(reinterpret_cast<std::uintptr_t>(c2.d_expert_out) == 0x4000);
  REQUIRE(reinterpret_cast<std::uintptr_t>(c2.d_x) == 0x4100);
  REQUIRE(reinterpret_cast<std::uintptr_t>(c2.d_y) == 0x4200);
  REQUIRE((c2.rows == 11 && c2.tokens == 5 && c2.hidden == 9));
  REQUIRE(
      (c2.layout.d_assignment_row == lay.d_assignment_row && c2.dispatched.d_fate == dsp.d_fate));

  gating_backward_params<half_bits> gb;
  gb.d_logits = at<const half_bits>(0x5000);
  gb.tokens = 3;
  gb.d_valid = at<const std::uint8_t>(0x5100);
  gb.gated.d_ids = at<const std::int32_t>(0x5200);
  gb.dispatched = dsp;
  gb.d_grad_weight = at<const float>(0x5300);
  gb.weights.z = 0.25;
  gb.accumulate = false;
  gb.d_grad_logits = at<float>(0x5400);
  const auto gb2 = rebind<other_half>(gb);
  REQUIRE(reinterpret_cast<std::uintptr_t>(gb2.d_logits) == 0x5000);
  REQUIRE((gb2.tokens == 3 && gb2.d_valid == gb.d_valid && gb2.gated.d_ids == gb.gated.d_ids));
  REQUIRE((gb2.dispatched.d_weight == dsp.d_weight && gb2.d_grad_weight == gb.d_grad_weight));
  REQUIRE((gb2.weights.z == 0.25 && !gb2.accumulate && gb2.d_grad_logits == gb.d_grad_logits));

  combine_backward_params<half_bits> cb;
  cb.d_expert_out = at<const half_bits>(0x6000);
  cb.d_dy = at<const half_bits>(0x6100);
  cb.rows = 11;
  cb.tokens = 5;
  cb.hidden = 9;
  cb.layout = lay;
  cb.dispatched = dsp;
  cb.d_grad_expert_out = at<half_bits>(0x6200);
  cb.d_grad_weight = at<float>(0x6300);
  cb.d_grad_x = at<half_bits>(0x6400);
  const auto cb2 = rebind<other_half>(cb);
  REQUIRE((reinterpret_cast<std::uintptr_t>(cb2.d_expert_out) == 0x6000 &&
           reinterpret_cast<std::uintptr_t>(cb2.d_dy) == 0x6100 &&
           reinterpret_cast<std::uintptr_t>(cb2.d_grad_expert_out) == 0x6200 &&
           reinterpret_cast<std::uintptr_t>(cb2.d_grad_x) == 0x6400));
  REQUIRE((cb2.rows == 11 && cb2.tokens == 5 && cb2.hidden == 9 &&
           cb2.d_grad_weight == cb.d_grad_weight));
  REQUIRE((cb2.layout.d_row_token == lay.d_row_token && cb2.dispatched.d_weight == dsp.d_weight));

  permute_backward_params<half_bits> pb;
  pb.d_grad_buf = at<const half_bits>(0x7000);
  pb.rows = 11;
  pb.tokens = 5;
  pb.hidden = 9;
  pb.layout = lay;
  pb.accumulate = true;
  pb.d_grad_x = at<half_bits>(0x7100);
  const auto pb2 = rebind<other_half>(pb);
  REQUIRE((reinterpret_cast<std::uintptr_t>(pb2.d_grad_buf) == 0x7000 &&
           reinterpret_cast<std::uintptr_t>(pb2.d_grad_x) == 0x7100));
  REQUIRE((pb2.rows == 11 && pb2.tokens == 5 && pb2.hidden == 9 && pb2.accumulate));
  REQUIRE(pb2.layout.d_assignment_row == lay.d_assignment_row);
}

}  // namespace
}  // namespace moeroute::test
