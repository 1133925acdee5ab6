"""Reproductions of the papers' findings; each writes its section of a page in docs/results/."""
