"""The node agent: launches placed runs on its nodes, supervises them, reads their output and
reports facts (a run started, a rank exited with X, the image is missing) to the control plane,
which decides what they mean for the job."""
