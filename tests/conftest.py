"""Test-wide settings: strict numpy rank promotion so silent broadcasting bugs fail loudly."""
import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
