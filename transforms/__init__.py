"""Beam transforms and the plain functions they call (testable without Beam)."""
