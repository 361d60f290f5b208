"""Exercise grading: build starter notebooks from solutions, and grade a learner's notebook."""
