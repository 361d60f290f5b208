"""The course as a static website (``./course book``): executed lessons, read-only exercises and
quizzes without their answers, built with Sphinx, MyST-NB and the book theme."""
