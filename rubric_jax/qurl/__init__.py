"""QuRL case-wise rubric construction: retrieval with a quality prior, meta-descriptions, candidate rubrics
under four principles, a discriminativeness filter, merging, and the resumable build (pipeline.run_build)."""
