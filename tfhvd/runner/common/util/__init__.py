"""Helpers under Horovod's ``horovod.runner.common.util`` path that training
scripts import (:mod:`tfhvd.runner.common.util.env`)."""
