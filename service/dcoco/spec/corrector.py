"""The DCOCO corrector: scores every transition between adjacent slots' candidates at once.

    z[p, k]    = silu(W_tok · embed(c[p, k]) + W_slot · h_p)          candidate representation
    s_p        = silu(W_pair · [h_p ; h_{p+1}])                        pair state, once per pair
    Delta(a,b) = w_out · relu(U_from · z[p, a] + U_to · z[p+1, b] + U_pair · s_p) + b_out
    S_p[a, b]  = l[p+1, b] + Delta(a, b)

The first MLP layer is linear in (z_a, z_b, s_p), so it splits into three projections that
broadcast to [R, B-1, K, K, M]; nothing loops over positions or candidates. `w_out` and `b_out`
start at zero, so an untrained corrector scores every transition with the drafter's own logit
and every selection rule reproduces the plain DFlash draft.

Cost: the [R, B-1, K, K, M] tensor is the only large one, hence ReLU applied in place and a
small M. Outside training, W_tok · embed is computed once for the whole vocabulary and each
candidate's row is gathered from that table.
"""

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class CorrectorConfig:
    top_k: int = 16  # K candidates per slot; the paper's top-16 holds most of the misses
    rep_dim: int = 64  # width of the candidate representation z
    pair_dim: int = 64  # width of the pair state s_p
    mlp_dim: int = 16  # hidden width of Delta; it runs (B-1)K² times per cycle, keep it small

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Corrector(nn.Module):
    def __init__(self, cfg: CorrectorConfig, hidden_size: int, embed_dim: int) -> None:
        super().__init__()
        self.config = cfg
        self.rep_token = nn.Linear(embed_dim, cfg.rep_dim, bias=False)
        self.rep_slot = nn.Linear(hidden_size, cfg.rep_dim)
        self.pair = nn.Linear(2 * hidden_size, cfg.pair_dim)
        self.delta_from = nn.Linear(cfg.rep_dim, cfg.mlp_dim, bias=False)
        self.delta_to = nn.Linear(cfg.rep_dim, cfg.mlp_dim, bias=False)
        self.delta_pair = nn.Linear(cfg.pair_dim, cfg.mlp_dim)
        self.delta_out = nn.Linear(cfg.mlp_dim, 1)
        nn.init.zeros_(self.delta_out.weight)
        nn.init.zeros_(self.delta_out.bias)
        self._token_table: tuple[tuple[int, ...], torch.Tensor] | None = None

    def forward(
        self,
        slot_hidden: torch.Tensor,
        cand_ids: torch.Tensor,
        cand_logits: torch.Tensor,
        embed_weight: torch.Tensor,
    ) -> torch.Tensor:
        """Transition scores S [R, B-1, K, K] from one drafter pass.

        slot_hidden [R, B, H], cand_ids and cand_logits [R, B, K], embed_weight [V, E].
        """
        token = self.token_rep(cand_ids, embed_weight)  # [R, B, K, Z]
        z = F.silu(token + self.rep_slot(slot_hidden).unsqueeze(2))  # [R, B, K, Z]
        pairs = torch.cat([slot_hidden[:, :-1], slot_hidden[:, 1:]], dim=-1)  # [R, B-1, 2H]
        s = F.silu(self.pair(pairs))  # [R, B-1, P]
        from_a = self.delta_from(z[:, :-1]) + self.delta_pair(s).unsqueeze(2)  # [R, B-1, K, M]
        to_b = self.delta_to(z[:, 1:])  # [R, B-1, K, M]
        hidden = (from_a.unsqueeze(3) + to_b.unsqueeze(2)).relu_()  # [R, B-1, K, K, M]
        delta = hidden @ self.delta_out.weight[0] + self.delta_out.bias  # [R, B-1, K, K]
        return cand_logits[:, 1:].unsqueeze(2) + delta  # [R, B-1, K, K]

    @torch.inference_mode()
    def build_token_table(self, embed_weight: torch.Tensor) -> None:
        """Builds the whole-vocabulary table `token_rep` reads, now rather than on the first
        draft: in a timed step (the adaptive planners read drafting's seconds) or a CUDA graph."""
        probe = torch.zeros(1, dtype=torch.long, device=embed_weight.device)  # [1]
        self.token_rep(probe, embed_weight)

    def token_rep(self, ids: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        """W_tok · embed(ids) [..., Z]; from a whole-vocabulary table when no gradient is needed.

        The table is keyed on the identity and version counters of both weights, so any update
        to either (an optimizer step, load_state_dict) rebuilds it.
        """
        if torch.is_grad_enabled():
            return self.rep_token(F.embedding(ids, embed_weight))  # [..., Z]
        w = self.rep_token.weight
        key = (embed_weight.data_ptr(), embed_weight._version, w.data_ptr(), w._version)
        if self._token_table is None or self._token_table[0] != key:
            self._token_table = (key, self.rep_token(embed_weight))  # [V, Z]
        return F.embedding(ids, self._token_table[1])  # [..., Z]
