"""Upper confidence bounds on the selection-conditioned error rate R(t) from (FD, n) counts.

Conditional on n(t) = n accepted calibration points, FD(t) ~ Binomial(n, R(t)) (paper, Theorem 1), so every
bound here is a one-sided (1 - γ) upper confidence bound for a binomial proportion. Each bound comes in two
forms: the UCB itself (for tables and reports) and a *feasibility* test `UCB <= alpha` written in the
cheapest exact form, which is what the threshold searches call on every candidate.

All functions are vectorised: `fd`, `n` and `gamma` broadcast against each other; scalars in, float out.
Conventions: a bound is 1 where n = 0, and Clopper–Pearson is 1 where fd = n.

Every bound is one `Bound` record in `BOUNDS` (its UCB, its feasibility test, its table of largest feasible
error counts, its label); searches, the split protocol, the CLI and the reports read the registry, so adding
a bound is adding one record.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from cic.errors import UserError
from cic.registry import Registry


def _counts(fd: Any, n: Any, gamma: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Broadcast and check (fd, n, gamma); report whether every input was a scalar."""
    scalar = all(np.ndim(x) == 0 for x in (fd, n, gamma))
    fd_a, n_a, g_a = np.broadcast_arrays(np.asarray(fd, dtype=np.float64), np.asarray(n, dtype=np.float64),
                                         np.asarray(gamma, dtype=np.float64))
    if (~np.isfinite(n_a) | (n_a < 0) | (n_a != np.floor(n_a))).any():
        bad = n_a[~np.isfinite(n_a) | (n_a < 0) | (n_a != np.floor(n_a))].flat[0].item()
        raise UserError(f"n = {bad!r}: the accepted count must be a non-negative integer")
    bad_fd = ~np.isfinite(fd_a) | (fd_a < 0) | (fd_a != np.floor(fd_a)) | (fd_a > n_a)
    if bad_fd.any():
        raise UserError(f"fd = {fd_a[bad_fd].flat[0].item()!r} with n = {n_a[bad_fd].flat[0].item()!r}: the error "
                         "count must be an integer with 0 <= fd <= n")
    bad_gamma = ~(g_a > 0) | ~(g_a < 1)
    if bad_gamma.any():
        raise UserError(f"gamma = {g_a[bad_gamma].flat[0].item()!r}: must lie strictly between 0 and 1")
    return fd_a, n_a, g_a, scalar


def _check_alpha(alpha: Any) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if (~(a > 0) | ~(a < 1)).any():
        raise UserError(f"alpha = {a[~(a > 0) | ~(a < 1)].flat[0].item()!r}: must lie strictly between 0 and 1")
    return a


def _out(x: np.ndarray, scalar: bool) -> Any:
    return x.item() if scalar else x


# ----------------------------------------------------------------------------------------------------------
# Hoeffding


def hoeffding_ucb(fd: Any, n: Any, gamma: Any) -> Any:
    """Hoeffding UCB: B_H = FD/n + sqrt(log(1/γ) / (2n)), and 1 where n = 0 (paper §3.2).

    Not clipped to 1: the paper's formula as printed (any value >= 1 is infeasible for every alpha < 1).
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    out = np.ones_like(n_a)
    pos = n_a > 0
    out[pos] = fd_a[pos] / n_a[pos] + np.sqrt(np.log(1.0 / g_a[pos]) / (2.0 * n_a[pos]))
    return _out(out, scalar)


def hoeffding_feasible(fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where B_H(fd, n; γ) <= alpha (n = 0 is never feasible)."""
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    a = np.broadcast_to(_check_alpha(alpha), n_a.shape)
    out = np.zeros(n_a.shape, dtype=bool)
    pos = n_a > 0
    out[pos] = fd_a[pos] / n_a[pos] + np.sqrt(np.log(1.0 / g_a[pos]) / (2.0 * n_a[pos])) <= a[pos]
    return _out(out, scalar)


# ----------------------------------------------------------------------------------------------------------
# Clopper–Pearson (exact binomial)


def clopper_pearson_ucb(fd: Any, n: Any, gamma: Any) -> Any:
    """Clopper–Pearson UCB: B_CP = BetaInv(1 - γ; FD + 1, n - FD); 1 where n = 0 or FD = n (paper §3.2).

    The exact one-sided binomial bound: P(R <= B_CP) >= 1 - γ for every n and R.
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    out = np.ones_like(n_a)
    inner = (n_a > 0) & (fd_a < n_a)
    # the complemented inverse solves 1 - I_x(a, b) = γ without forming 1 - γ, which rounds to 1 below γ ≈ 1e-16
    # (δ = 1e-300, or Bonferroni's δ / K with K = 10⁶); scipy returns NaN only where the bound rounds to 1
    with np.errstate(all="ignore"):
        value = special.betainccinv(fd_a[inner] + 1.0, n_a[inner] - fd_a[inner], g_a[inner])
    out[inner] = np.where(np.isnan(value), 1.0, value)
    return _out(out, scalar)


def clopper_pearson_feasible(fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where B_CP(fd, n; γ) <= alpha, tested as BinomCDF(fd; n, alpha) <= γ (no inversion).

    The two are the same event because P(Beta(fd+1, n-fd) <= α) = P(Binomial(n, α) >= fd+1).
    Where fd > alpha·n the binomial CDF is at least 1/2 (fd exceeds the median), so for γ < 1/2 those
    entries are infeasible without evaluating the CDF.
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    a = np.broadcast_to(_check_alpha(alpha), n_a.shape)
    out = np.zeros(n_a.shape, dtype=bool)
    todo = (n_a > 0) & (fd_a < n_a) & ((fd_a <= a * n_a) | (g_a >= 0.5))
    out[todo] = special.bdtr(fd_a[todo].astype(np.int64), n_a[todo].astype(np.int64), a[todo]) <= g_a[todo]
    return _out(out, scalar)


# ----------------------------------------------------------------------------------------------------------
# Hoeffding-KL (Chernoff)


def _bernoulli_kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """kl(p || q) = p log(p/q) + (1-p) log((1-p)/(1-q)), with 0 log 0 = 0."""
    return special.rel_entr(p, q) + special.rel_entr(1.0 - p, 1.0 - q)


def hoeffding_kl_ucb(fd: Any, n: Any, gamma: Any) -> Any:
    """Hoeffding-KL (Chernoff) UCB: sup{q in [p̂, 1] : n · kl(p̂ || q) <= log(1/γ)}, p̂ = FD/n; 1 where n = 0.

    From the Chernoff bound P(p̂ <= x) <= exp(-n kl(x || R)) for x <= R (Hoeffding 1963, Thm 1); tighter than
    the plain Hoeffding bound (Pinsker: kl >= 2(p - q)^2), looser than Clopper–Pearson for 0/1 errors.
    Solved by bisection to machine precision.
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    out = np.ones_like(n_a)
    inner = (n_a > 0) & (fd_a < n_a)
    if inner.any():
        p = fd_a[inner] / n_a[inner]
        level = np.log(1.0 / g_a[inner]) / n_a[inner]
        lo, hi = p.copy(), np.ones_like(p)
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            within = _bernoulli_kl(p, mid) <= level
            lo = np.where(within, mid, lo)
            hi = np.where(within, hi, mid)
        out[inner] = hi
    return _out(out, scalar)


def hoeffding_kl_feasible(fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where the Hoeffding-KL UCB <= alpha, i.e. p̂ < alpha and n · kl(p̂ || alpha) >= log(1/γ)."""
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    a = np.broadcast_to(_check_alpha(alpha), n_a.shape)
    out = np.zeros(n_a.shape, dtype=bool)
    todo = (n_a > 0) & (fd_a < a * n_a)
    p = fd_a[todo] / n_a[todo]
    out[todo] = n_a[todo] * _bernoulli_kl(p, a[todo]) >= np.log(1.0 / g_a[todo])
    return _out(out, scalar)


# ----------------------------------------------------------------------------------------------------------
# Bentkus and Hoeffding–Bentkus (Bates et al. 2021, RCPS)


def bentkus_ucb(fd: Any, n: Any, gamma: Any) -> Any:
    """Bentkus UCB: the smallest q with e · BinomCDF(FD; n, q) <= γ, i.e. Clopper–Pearson at level γ/e.

    Bentkus (2004): for losses in [0, 1] with mean R, P(Σ L_i <= k) <= e · P(Binomial(n, R) <= k). For 0/1 errors
    the binomial tail is exact, so this bound equals B_CP(FD, n; γ/e) — always a little looser than CP; it is
    offered for comparison with the bounded-loss risk-control literature.
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    return _out(np.asarray(clopper_pearson_ucb(fd_a, n_a, g_a / math.e)), scalar)


def bentkus_feasible(fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where e · BinomCDF(fd; n, alpha) <= γ."""
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    return _out(np.asarray(clopper_pearson_feasible(fd_a, n_a, alpha, g_a / math.e)), scalar)


def hoeffding_bentkus_ucb(fd: Any, n: Any, gamma: Any) -> Any:
    """Hoeffding–Bentkus UCB: smallest q with p_HB(q) = min(exp(-n kl(min(p̂, q) || q)), e·BinomCDF(FD; n, q)) <= γ.

    Both terms decrease in q, so the UCB is min(Hoeffding-KL UCB at γ, Bentkus UCB at γ) (Bates et al. 2021).
    """
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    out = np.minimum(np.asarray(hoeffding_kl_ucb(fd_a, n_a, g_a)), np.asarray(bentkus_ucb(fd_a, n_a, g_a)))
    return _out(out, scalar)


def hoeffding_bentkus_feasible(fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where p_HB(alpha) <= γ: the Hoeffding-KL test or the Bentkus test passes."""
    fd_a, n_a, g_a, scalar = _counts(fd, n, gamma)
    out = np.asarray(hoeffding_kl_feasible(fd_a, n_a, alpha, g_a)) | np.asarray(
        bentkus_feasible(fd_a, n_a, alpha, g_a))
    return _out(out, scalar)


# ----------------------------------------------------------------------------------------------------------
# Tables of the largest feasible error count


def _settle(bound: str, n: np.ndarray, k: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    """Move a guess k for the largest feasible FD at each n to the exact value (feasibility is monotone in FD)."""
    k = np.clip(k, -1, n - 1)
    for _ in range(64):
        up = k + 1 < n
        up[up] = feasible(bound, k[up] + 1, n[up], alpha, gamma)
        down = k >= 0
        down[down] = ~np.asarray(feasible(bound, k[down], n[down], alpha, gamma), dtype=bool)
        if not (up.any() or down.any()):
            return k
        k = k + up - down
    return _bisect_max_errors(bound, n, alpha, gamma)


def _bisect_max_errors(bound: str, n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    lo = np.full(n.shape, -1, dtype=np.int64)  # feasible (or the -1 sentinel)
    hi = n.copy()  # FD = n is infeasible for every bound and alpha < 1
    while True:
        gap = hi - lo > 1
        if not gap.any():
            return lo
        mid = (lo + hi) // 2
        ok = np.zeros(n.shape, dtype=bool)
        ok[gap] = feasible(bound, mid[gap], n[gap], alpha, gamma)
        lo = np.where(gap & ok, mid, lo)
        hi = np.where(gap & ~ok, mid, hi)


def _cp_max_errors_one(n: int, alpha: float, gamma: float) -> int:
    """Largest k with BinomCDF(k; n, alpha) <= gamma (-1 if none), from scipy's continuous inverse."""
    if n == 0:
        return -1
    with np.errstate(all="ignore"):
        guess = special.bdtrik(gamma, n, alpha)
    k = int(np.floor(guess)) if np.isfinite(guess) else -1
    return int(_settle("cp", np.array([n], dtype=np.int64), np.array([k], dtype=np.int64), alpha, gamma)[0])


def _cp_max_errors_range(n_lo: int, n_hi: int, alpha: float, gamma: float) -> np.ndarray:
    """Largest feasible FD under Clopper–Pearson for every n in [n_lo, n_hi].

    BinomCDF(k; n, alpha) decreases in n, so FD = k becomes feasible at a first count n_first(k) and stays
    so; n_first(k) for the k in range comes from scipy's continuous inverse `bdtrin` and is verified exactly
    with two CDF evaluations. Cost: about alpha · (n_hi - n_lo) evaluations instead of one per n.
    """
    k_lo, k_hi = _cp_max_errors_one(n_lo, alpha, gamma), _cp_max_errors_one(n_hi, alpha, gamma)
    counts = np.arange(n_lo, n_hi + 1, dtype=np.int64)
    if k_hi < 0:
        return np.full(counts.shape, -1, dtype=np.int64)
    k = np.arange(max(k_lo, 0), k_hi + 1, dtype=np.int64)
    # bdtrin is costly at large n: invert at every 32nd k and interpolate, then settle each k exactly
    knots = np.unique(np.append(k[::32], k[-1]))
    with np.errstate(all="ignore"):
        at_knots = special.bdtrin(knots.astype(np.float64), gamma, alpha)
    if not np.isfinite(at_knots).all():
        return _bisect_max_errors("cp", counts, alpha, gamma)
    first = np.maximum(np.ceil(np.interp(k, knots, at_knots)).astype(np.int64), k + 1)
    active = np.ones(k.shape, dtype=bool)
    for _ in range(200):
        ka, fa = k[active], first[active]
        late = fa - 1 > ka
        late[late] = special.bdtr(ka[late], fa[late] - 1, alpha) <= gamma
        early = special.bdtr(ka, fa, alpha) > gamma
        moved = late | early
        first[active] = fa - late + early
        active[active] = moved
        if not active.any():
            break
    else:  # pragma: no cover - interpolation is within a few units; never seen to need this
        return _bisect_max_errors("cp", counts, alpha, gamma)
    first = np.maximum.accumulate(first)  # guards the monotone structure against rounding
    return k[0] - 1 + np.searchsorted(first, counts, side="right").astype(np.int64)


def _bisect_table(bound: str) -> Callable[[np.ndarray, float, float], np.ndarray]:
    return lambda n, alpha, gamma: _bisect_max_errors(bound, n, alpha, gamma)


def _cp_table(level: Callable[[float], float]) -> Callable[[np.ndarray, float, float], np.ndarray]:
    def table(n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
        lo = int(n.min())
        return _cp_max_errors_range(lo, int(n.max()), alpha, level(gamma))[n - lo]
    return table


def _hoeffding_table(n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        guess = np.floor(n * alpha - np.sqrt(n * math.log(1.0 / gamma) / 2.0)).astype(np.int64)
    return _settle("hoeffding", n, guess, alpha, gamma)


def max_errors(bound: str, n: Any, alpha: float, gamma: float) -> np.ndarray:
    """For each accepted count n, the largest FD that is still feasible (-1 when none is).

    Every bound is increasing in FD at fixed n, so `fd <= max_errors(n)` is the feasibility test; the split
    protocol and the simulator use this table to test millions of (n, FD) pairs with one gather.
    Clopper–Pearson (and Bentkus, which is CP at gamma/e) and Hoeffding have fast exact paths; the other
    bounds are found by bisection on FD.
    """
    record = get_bound(bound)
    n_a = np.asarray(n, dtype=np.int64)
    if n_a.size == 0:
        return n_a.copy()
    return record.max_errors(n_a, alpha, gamma)


def min_certifiable_n(bound: str, alpha: float, gamma: float) -> int:
    """The smallest accepted count at which the bound can certify alpha at all (with zero errors).

    Below it every test fails whatever the labels. For Clopper–Pearson it is ceil(log γ / log(1 - alpha));
    for Hoeffding ceil(log(1/γ) / (2 alpha²)).
    """
    hi = 1
    while not feasible(bound, 0, hi, alpha, gamma):
        hi *= 2
        if hi > 2**50:
            raise UserError(f"bound = {bound!r} cannot certify alpha = {alpha!r} at gamma = {gamma!r}")
    lo = hi // 2  # infeasible (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if feasible(bound, 0, mid, alpha, gamma):
            hi = mid
        else:
            lo = mid
    return hi


@functools.lru_cache(maxsize=4096)
def half_alpha_n(bound: str, alpha: float, gamma: float) -> int:
    """The smallest accepted count n at which an empirical risk of alpha/2 (FD = floor(alpha·n/2)) is certified.

    A label-free function of (bound, alpha, gamma): the default first test of fixed-sequence search, where
    a threshold whose true risk is about alpha/2 has an even chance to pass instead of almost none. Cached: a
    split protocol asks it once per split with the same arguments.
    """
    return _certified_at_rate(bound, alpha, gamma, alpha / 2.0)


def margin_rate(alpha: float) -> float:
    """alpha less half its distance to the nearer end of [0, 1]: alpha/2 up to alpha = 1/2, (3·alpha - 1)/2 above,
    so that the margin shrinks as 1 - alpha does where the binomial's spread does (symmetric in errors and hits)."""
    return alpha - min(alpha, 1.0 - alpha) / 2.0


@functools.lru_cache(maxsize=4096)
def margin_n(bound: str, alpha: float, gamma: float) -> int:
    """The smallest accepted count at which an empirical risk of `margin_rate(alpha)` is certified: `half_alpha_n`
    for alpha <= 1/2; near alpha = 1 it grows with alpha instead of falling to a count of 2 (where a threshold whose
    risk is just under alpha has almost no chance to pass). Label-free, like half_alpha_n."""
    return _certified_at_rate(bound, alpha, gamma, margin_rate(alpha))


def _certified_at_rate(bound: str, alpha: float, gamma: float, rate: float) -> int:
    """The smallest n at which floor(rate·n) errors among n accepted answers certify alpha at gamma."""
    size = 1024
    while True:
        n = np.arange(1, size + 1, dtype=np.int64)
        ok = np.asarray(feasible(bound, np.floor(rate * n).astype(np.int64), n, alpha, gamma), dtype=bool)
        if ok.any():
            return int(n[np.argmax(ok)])
        if size > 2**26:
            raise UserError(f"bound = {bound!r} cannot certify alpha = {alpha!r} at gamma = {gamma!r}")
        size *= 4


# ----------------------------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True)
class Bound:
    """One upper confidence bound on a binomial proportion, with everything the searches and reports need.

    `ucb(fd, n, gamma)` and `feasible(fd, n, alpha, gamma)` are vectorised; `max_errors(n, alpha, gamma)` gives
    the largest feasible FD per accepted count (-1 where none). `rate_is_necessary(gamma)` says whether
    FD <= alpha·n must hold for feasibility (every bound here is >= FD/n, except Clopper–Pearson at
    gamma >= 1/2), which lets a search skip candidates cheaply. `table_is_cheap`: building `max_errors` over
    a narrow range of n costs about alpha · (range) evaluations, less than testing each candidate.
    """

    name: str
    label: str
    ucb: Callable[..., Any]
    feasible: Callable[..., Any]
    max_errors: Callable[[np.ndarray, float, float], np.ndarray]
    aliases: tuple[str, ...] = ()
    rate_is_necessary: Callable[[float], bool] = lambda gamma: True
    table_is_cheap: bool = False
    description: str = ""
    table_label: str = ""  # the paper's column name (UCB-HFD, UCB-CP); UCB-<name> when empty


BOUNDS: Registry[Bound] = Registry("bound", (
    Bound("hoeffding", "Hoeffding", hoeffding_ucb, hoeffding_feasible, _hoeffding_table, aliases=("hfd",),
          table_label="UCB-HFD",
          description="FD/n + sqrt(log(1/γ) / 2n): distribution-free, loose at small n (paper §3.2)"),
    Bound("cp", "Clopper–Pearson", clopper_pearson_ucb, clopper_pearson_feasible, _cp_table(lambda g: g),
          aliases=("clopper_pearson", "clopper-pearson"), rate_is_necessary=lambda gamma: gamma < 0.5,
          table_is_cheap=True, table_label="UCB-CP",
          description="BetaInv(1-γ; FD+1, n-FD), tested as BinomCDF(FD; n, α) <= γ: exact for 0/1 errors"),
    Bound("hoeffding_kl", "Hoeffding-KL", hoeffding_kl_ucb, hoeffding_kl_feasible, _bisect_table("hoeffding_kl"),
          aliases=("chernoff", "kl"), description="Chernoff: sup{q : n kl(FD/n || q) <= log(1/γ)}"),
    Bound("bentkus", "Bentkus", bentkus_ucb, bentkus_feasible, _cp_table(lambda g: g / math.e),
          table_is_cheap=True, description="e · BinomCDF(FD; n, q) <= γ: Clopper–Pearson at γ/e"),
    Bound("hoeffding_bentkus", "Hoeffding–Bentkus", hoeffding_bentkus_ucb, hoeffding_bentkus_feasible,
          _bisect_table("hoeffding_bentkus"), aliases=("hb",),
          description="min of Hoeffding-KL and Bentkus (Bates et al. 2021, RCPS)"),
), base=Bound, group="cic.bounds")
BOUND_NAMES: tuple[str, ...] = BOUNDS.names(plugins=False)  # the built-in bounds (plug-ins: BOUNDS.names())
for _bound in (BOUNDS[name] for name in BOUND_NAMES):
    BOUNDS.alias(*_bound.aliases, to=_bound.name)


def get_bound(name: Any) -> Bound:
    """The registry record of `name` (accepts the aliases, e.g. "clopper_pearson" -> cp)."""
    return BOUNDS.lookup(name)


def resolve_bound(name: Any) -> str:
    """Canonical bound name for `name` (accepts a few aliases, e.g. "clopper_pearson" -> "cp")."""
    return get_bound(name).name


def ucb(bound: str, fd: Any, n: Any, gamma: Any) -> Any:
    """The named upper confidence bound at confidence 1 - γ."""
    return get_bound(bound).ucb(fd, n, gamma)


def feasible(bound: str, fd: Any, n: Any, alpha: Any, gamma: Any) -> Any:
    """True where the named bound certifies alpha: UCB(fd, n; γ) <= alpha."""
    return get_bound(bound).feasible(fd, n, alpha, gamma)


def might_be_feasible(bound: str, fd: np.ndarray, n: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    """A cheap necessary condition for feasibility: FD <= alpha · n, where the bound allows it."""
    if not get_bound(bound).rate_is_necessary(gamma):
        return np.ones(np.shape(n), dtype=bool)
    return fd <= n * (alpha * (1.0 + 1e-12))
