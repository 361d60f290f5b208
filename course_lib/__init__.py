"""course_lib: the real systems code behind the course, and the views that teach it.

Layers (imports point downwards only):
    widgets/, grading/, quiz/         teaching UI over the layers below
    perf/, paging/, engine/, models/, kernels/, collectives/   real systems code, no widgets
"""

__version__ = "0.1.0"
