"""Accuracy-probe designs on the real example's kept states, against CIC's own estimators: AUROC and the score's
limit on a test half, for the probe on all kept features, on one (layer, position) block, on principal components
fitted label-free on every question, and with the run's own one-pass and sampled scores as features.

    .venv/bin/python infra/scripts/probe_design_table.py --db cic-example-probes.duckdb \
        --dataset trivia_qa --criterion "similarity[0.6]" [--draws 3]

Per draw the questions are halved as in `probe_real_table.py`; each design is fitted on the same 40% fit split of
the labelled half (logistic regression, C by 5-fold cross-validated log loss) and read on the test half. Used to
choose the probe's design (docs/statistics.md, "Learned scores"); it certifies nothing.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_real_table import FIT_SHARE, load  # noqa: E402

from cic.llm.probes import fit_split  # noqa: E402
from cic.stats.limits import score_limit  # noqa: E402

ALPHAS = (0.15, 0.2, 0.25)


def logistic() -> object:
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=np.logspace(-5, 1, 7), cv=5,
                                                                scoring="neg_log_loss", max_iter=2000))


def designs(x: np.ndarray, s: np.ndarray, n_layers: int, layers: list[int], mc: bool) -> dict[str, np.ndarray]:
    """Feature matrices by design name (the positions of a multiple-choice run hold the same state: one kept)."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    width = x.shape[1] // (2 * n_layers)
    out = {"all kept features": x}
    for p, position in enumerate(("prompt", "answer")):
        if mc and p == 1:
            continue
        for i, layer in enumerate(layers):
            start = (p * n_layers + i) * width
            out[f"layer {layer} at the {position}"] = x[:, start:start + width]
    for k in (16, 64):
        out[f"{k} principal components"] = PCA(k, random_state=0).fit_transform(StandardScaler().fit_transform(x))
    out["the run's scores alone"] = s
    out["16 components + the run's scores"] = np.column_stack([out["16 principal components"], s])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--criterion", required=True)
    parser.add_argument("--draws", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from sklearn.metrics import roc_auc_score

    table, x, layers = load(args.db, args.dataset, args.criterion)
    ids = table.get_column("question_id").cast(pl.String).to_numpy()
    e = table.get_column("error").to_numpy().astype(int)
    names = [c for c in table.columns if c not in ("question_id", "error")]
    scores = np.column_stack([table.get_column(c).to_numpy() for c in names])
    scored = ~np.isnan(scores).any(axis=0)
    scores, names = scores[:, scored], [n for n, k in zip(names, scored, strict=True) if k]
    feats = designs(x, scores, len(layers), layers, args.dataset == "commonsense_qa")
    results: dict[str, list[tuple[float, ...]]] = {}
    for draw in range(args.draws):
        order = np.random.default_rng(draw).permutation(len(ids))
        test, labelled = order[: len(ids) // 2], order[len(ids) // 2:]
        chosen = set(fit_split(list(ids[labelled]), FIT_SHARE, draw))
        fit = np.array([i for i in labelled if ids[i] in chosen])
        read = [(f"estimator {name}", scores[:, j]) for j, name in enumerate(names)]
        read += [(f"probe: {name}", logistic().fit(f[fit], e[fit]).predict_proba(f)[:, 1])  # type: ignore[attr-defined]
                 for name, f in feats.items()]
        for name, s in read:
            results.setdefault(name, []).append(
                (roc_auc_score(e[test], s[test]), *(score_limit(s[test], e[test], a) for a in ALPHAS)))
    print(f"{args.dataset} · {args.criterion}: {len(ids)} questions, error rate {e.mean():.3f}, {args.draws} draws, "
          f"{len(fit)} fit questions in the last")
    print("\n| score | AUROC | " + " | ".join(f"limit α={a}" for a in ALPHAS) + " |")
    print("|---|---:|" + "---:|" * len(ALPHAS))
    rows = sorted(((float(np.mean([r[0] for r in v])), *np.mean([r[1:] for r in v], axis=0), k)
                   for k, v in results.items()), reverse=True)
    for row in rows:
        print(f"| {row[-1]} | {row[0]:.3f} | " + " | ".join(f"{v:.3f}" for v in row[1:-1]) + " |")


if __name__ == "__main__":
    main()
