"""The trainer: one process per trained cohort member.

It reads the member's graded batches from Redis with a consumer group, takes GRPO-family policy
steps on its own copy of the member's weights, checkpoints durably and publishes new weight
versions to the member's model servers. Pure math lives in ``advantages``, ``losses`` and
``collate``; I/O in ``batches`` (Redis), ``publish`` (weights store, HTTP), ``checkpoint`` (disk).
"""
