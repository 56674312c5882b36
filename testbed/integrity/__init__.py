"""Silent data corruption caught: detectors (:mod:`.detectors`), the check after each step
(:mod:`.inspector`) and the rollback to a checkpoint a hash vouched for (:mod:`.rollback`)."""
