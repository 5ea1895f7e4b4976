"""What the tests share: tiny run configs (tiny), a local S3 server (s3_server), Ray processes and
`convsts train` subprocesses (local_cluster), a toy task (toy_task) and small tune spaces
(small_spaces), the last two found by name with tests/ on the path (`testkit.toy_task`)."""
