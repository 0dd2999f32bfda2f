"""The foundations every layer uses; each module imports nothing of the project but errors:

  errors   the failures a user sees as one line
  safeio   files never seen half-written, and folder locks
  layout   channels_last, and the contiguous views collectives need
  recipe   the training recipes the defaults come from
  redact   secrets in URIs and flags written as ***
  svgchart line charts written as SVG text (curves.svg, sweep.svg, search.svg)
"""
