"""`amity bench`: serving benchmarks (`bench serve`) and peer comparisons (`bench compare`)."""
