"""Audits of a model and its inputs: provenance, adversarial attacks and shift detection, backdoor trigger
scanning, confidence and out-of-distribution analysis, membership inference, behaviour consistency.

Each engine is a class whose result is an ``encoderkit.reports.Report`` (JSON + Markdown + PNG); the
``encoderkit scan <engine>`` commands are thin shells over them.
"""
from .attacks import AttackResult, WordAttack
from .backdoor import BackdoorReport, BackdoorTriggerScanner, TriggerCandidate
from .confidence import (
    ClassifierConfidenceAnalyzer,
    ConfidenceReport,
    MahalanobisFit,
    energy_score,
    expected_calibration_error,
    max_softmax_probability,
)
from .consistency import BehaviorConsistencyValidator, ConsistencyReport
from .membership import MembershipInference, MembershipReport, MLMScorer
from .provenance import ModelProvenanceChecker, ProvenanceReport, check_provenance
from .shift import EmbeddingShiftDetector, ShiftReport

__all__ = [
    "AttackResult", "BackdoorReport", "BackdoorTriggerScanner", "BehaviorConsistencyValidator",
    "ClassifierConfidenceAnalyzer", "ConfidenceReport", "ConsistencyReport", "EmbeddingShiftDetector", "MLMScorer",
    "MahalanobisFit", "MembershipInference", "MembershipReport", "ModelProvenanceChecker", "ProvenanceReport",
    "ShiftReport", "TriggerCandidate", "WordAttack", "check_provenance", "energy_score", "expected_calibration_error",
    "max_softmax_probability",
]
