"""`warmstart drill`: the render's scale-out predictions checked on the user's own cluster in one
command (docs/drill.md).

- plan.py: what a run would change and what it predicts, pure (no cluster, no clock);
- manifests.py: the objects it creates (the load Job, the cache-bypassed pod, the restore Job)
  and the RBAC it needs;
- load_script.py: the load Job's program (standard library only, run by the router image's
  python3);
- restore.py: undoing what a run left, shared by the client (`--restore`, on finish, on Ctrl-C)
  and the in-cluster restore Job;
- measure.py: from the pods, events and logs to one line per replica (pure);
- report.py: the table, the record for the cold-start history and the picture;
- run.py / command.py: the command.
"""
