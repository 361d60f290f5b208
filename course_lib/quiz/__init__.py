"""Quiz banks (YAML), answer checking and the scorecard that records answers for grading."""
