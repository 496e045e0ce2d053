"""Cost model: XGBoost on knob features, predicting normalised throughput.

Like AutoTVM's ``XGBoostCostModel`` (Chameleon's "xgb-reg"): the target of a measured config is
``best_latency / latency`` (1.0 for the fastest, 0 for a failed one), so predictions are
comparable across iterations.  ``objective="rank"`` trains a pairwise ranker instead.  Features are
table lookups (``KnobSpace.features``), so scoring 10,000 configs takes a few milliseconds
(``bench/cost_model_speed.py``) and search strategies can call it on every step.
"""
from __future__ import annotations

import numpy as np
import xgboost as xgb

_PARAMS = {"max_depth": 3, "gamma": 1e-4, "min_child_weight": 1, "subsample": 1.0, "eta": 0.3,
           "lambda": 1.0, "alpha": 0.0, "nthread": 1, "verbosity": 0}
_OBJECTIVES = {"reg": "reg:squarederror", "rank": "rank:pairwise"}


class CostModel:
    def __init__(self, space, *, objective: str = "reg", rounds: int = 100, seed: int = 0):
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(_OBJECTIVES)}")
        self.space = space
        self.objective = objective
        self.rounds = rounds
        self.seed = seed
        self.booster: xgb.Booster | None = None

    @property
    def trained(self) -> bool:
        return self.booster is not None

    @staticmethod
    def targets(latencies) -> np.ndarray:
        """Normalised throughput: best latency / latency, 0 for failures (None / inf / nan)."""
        lat = np.array([np.inf if x is None else x for x in latencies], dtype=np.float64)
        lat[~np.isfinite(lat) | (lat <= 0)] = np.inf
        best = lat.min() if np.isfinite(lat).any() else 1.0
        return np.where(np.isfinite(lat), best / lat, 0.0)

    def fit(self, configs: np.ndarray, latencies) -> None:
        y = self.targets(latencies)
        if len(y) < 2 or not (y > 0).any():
            return
        dtrain = xgb.DMatrix(self.space.features(np.asarray(configs)), label=y)
        if self.objective == "rank":
            dtrain.set_group([len(y)])
        params = dict(_PARAMS, objective=_OBJECTIVES[self.objective], seed=self.seed)
        self.booster = xgb.train(params, dtrain, num_boost_round=self.rounds)

    def predict(self, configs: np.ndarray) -> np.ndarray:
        """Predicted fitness (higher = faster); zeros before the first fit."""
        configs = np.atleast_2d(configs)
        if self.booster is None:
            return np.zeros(len(configs))
        return np.asarray(self.booster.inplace_predict(self.space.features(configs)), dtype=np.float64)
