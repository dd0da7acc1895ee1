"""Released models loaded back into predictors, in plain Python (no scikit-learn).

A `model_training` step releases a JSON description of the model (see docs/models.md): trees as
node arrays, coefficients, the feature encoding and, with a fairness treatment, the randomised
classifier fairlearn built. `Predictor` reads that description and predicts:

    result = session.run(sealed)[0]
    model = result.model()            # or Predictor.from_output(result.output)
    model.predict_proba([{"age": 40, "region": "North"}])
    model.predict(frame)              # a pandas DataFrame works too, when pandas is installed

Predictions reproduce scikit-learn's: a tree compares the feature converted to float32 with its
threshold, as scikit-learn does. A fairness-treated model is randomised; `predict_proba` gives
the probabilities of its classes and `predict` the most probable class.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]


class ModelFormatError(ValueError):
    """The output is not a released model this client can load."""


def _float32(value: float) -> float:
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


def _softmax(scores: Sequence[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class _Tree:
    def __init__(self, data: Mapping[str, Any]):
        self.feature: list[int] = list(data["feature"])
        self.threshold: list[float] = [float(t) for t in data["threshold"]]
        self.left: list[int] = list(data["left"])
        self.right: list[int] = list(data["right"])
        self.value: list[list[float]] = [list(v) for v in data["value"]]
        self.counts: list[list[int] | None] | None = data.get("counts")

    def leaf(self, x32: Sequence[float]) -> int:
        node = 0
        while self.left[node] != -1:
            node = (
                self.left[node]
                if x32[self.feature[node]] <= self.threshold[node]
                else self.right[node]
            )
        return node

    def value_at(self, x32: Sequence[float]) -> list[float]:
        return self.value[self.leaf(x32)]


class _Model:
    """One fitted model (tree, forest, boosting or logistic regression) over encoded columns."""

    def __init__(self, spec: Mapping[str, Any], n_classes: int):
        self.family: str = spec["family"]
        self.n_classes = n_classes
        self.trees = [_Tree(t) for t in spec.get("trees", [])]
        self.per_stage = int(spec.get("per_stage", 1))
        self.init = [float(v) for v in spec.get("init", [])]
        self.learning_rate = float(spec.get("learning_rate") or 0.0)
        self.coefficients = [[float(c) for c in row] for row in spec.get("coefficients", [])]
        self.intercept = [float(v) for v in spec.get("intercept", [])]
        self.fitted = [int(c) for c in spec.get("fitted_classes", [])] or list(range(n_classes))

    def _spread(self, fitted_probs: Sequence[float]) -> list[float]:
        out = [0.0] * self.n_classes
        for index, p in zip(self.fitted, fitted_probs, strict=True):
            out[index] = p
        return out

    def proba(self, x: Sequence[float]) -> list[float]:
        if self.family == "logistic_regression":
            scores = [
                sum(c * v for c, v in zip(row, x, strict=True)) + b
                for row, b in zip(self.coefficients, self.intercept, strict=True)
            ]
            if len(scores) == 1:
                p = _sigmoid(scores[0])
                return self._spread([1.0 - p, p])
            return self._spread(_softmax(scores))
        x32 = [_float32(v) for v in x]
        if self.family == "gradient_boosting":
            raw = list(self.init)
            for i, tree in enumerate(self.trees):
                raw[i % self.per_stage] += self.learning_rate * tree.value_at(x32)[0]
            if self.per_stage == 1:
                p = _sigmoid(raw[0])
                return self._spread([1.0 - p, p])
            return self._spread(_softmax(raw))
        total = [0.0] * self.n_classes
        for tree in self.trees:
            for k, v in enumerate(tree.value_at(x32)):
                total[k] += v
        return [t / len(self.trees) for t in total]


class Predictor:
    """A released model: `predict_proba` and `predict` on records (mappings of feature names to
    values, or a pandas DataFrame)."""

    def __init__(self, output: Mapping[str, Any]):
        if output.get("type") != "model":
            raise ModelFormatError(f"this output is a {output.get('type')!r}, not a released model")
        self.output = output
        self.classes: list[Any] = list(output["classes"])
        self.features: list[Mapping[str, Any]] = list(output["features"])
        self.family: str = output["family"]
        self.metrics: Mapping[str, Any] = output.get("metrics", {})
        self.fairness: Mapping[str, Any] | None = output.get("fairness")
        n = len(self.classes)
        self._fair = output.get("fairness_predictor")
        self._model = _Model(output["model"], n)
        self._ensemble: list[tuple[float, _Model]] = []
        if self._fair is not None and self._fair["treatment"] == "exponentiated_gradient":
            self._ensemble = [
                (float(w), _Model(spec, n))
                for w, spec in zip(self._fair["weights"], self._fair["ensemble"], strict=True)
            ]

    @classmethod
    def from_output(cls, output: Mapping[str, Any]) -> Predictor:
        return cls(output)

    def _repr_html_(self) -> str:
        from safeaccess.client.notebook import predictor_html

        return predictor_html(self)

    # ------------------------------------------------------------------------------ encoding

    def encode(self, record: Record) -> list[float]:
        """The encoded columns of one record (numeric value; one 0/1 column per level)."""
        row: list[float] = []
        for feature in self.features:
            value = record[feature["name"]]
            if feature["kind"] == "numeric":
                row.append(float(value))
                continue
            row.extend(
                1.0 if value == level or str(value) == str(level) else 0.0
                for level in feature["levels"]
            )
        return row

    @staticmethod
    def _records(records: Iterable[Record] | Any) -> list[Record]:
        to_dict = getattr(records, "to_dict", None)
        if callable(to_dict) and hasattr(records, "columns"):
            return list(to_dict("records"))
        return list(records)

    # ---------------------------------------------------------------------------- prediction

    def _proba_one(self, record: Record) -> list[float]:
        x = self.encode(record)
        if self._ensemble:
            # fairlearn's randomised classifier: each member votes its predicted class
            out = [0.0] * len(self.classes)
            for weight, member in self._ensemble:
                probs = member.proba(x)
                out[probs.index(max(probs))] += weight
            total = sum(w for w, _ in self._ensemble)
            return [v / total for v in out]
        probs = self._model.proba(x)
        if self._fair is not None and self._fair["treatment"] == "threshold_optimizer":
            group = str(record[self._fair["protected"]])
            rule = self._fair["rules"].get(group)
            if rule is None:
                raise ModelFormatError(
                    f"the threshold optimiser has no rule for {self._fair['protected']}={group}"
                )
            score = probs[1]  # the positive class: the second declared level

            def fires(op: str, threshold: float) -> float:
                return 1.0 if (score > threshold if op == ">" else score < threshold) else 0.0

            p = rule["p0"] * fires(rule["operator0"], rule["threshold0"]) + rule["p1"] * fires(
                rule["operator1"], rule["threshold1"]
            )
            return [1.0 - p, p]
        return probs

    def predict_proba(self, records: Iterable[Record] | Any) -> list[list[float]]:
        """Probabilities of each class (in the order of `classes`) for every record."""
        return [self._proba_one(r) for r in self._records(records)]

    def predict(self, records: Iterable[Record] | Any) -> list[Any]:
        """The most probable class of every record."""
        out = []
        for probs in self.predict_proba(records):
            out.append(self.classes[probs.index(max(probs))])
        return out


def load_model(output: Mapping[str, Any]) -> Predictor:
    """A predictor for a released model output (`StepResult.output`)."""
    return Predictor(output)
