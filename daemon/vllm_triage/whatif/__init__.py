"""``whatif``: a recording's window, the simulator calibrated to it, and the same load run
on a changed server (``docs/physics.md``, "Predicted effects").

``changes`` reads ``KEY=VALUE`` changes; ``window`` reads the window of a recording (its
signals, the load interval by interval, the queue it started with); ``calibrate`` builds
a simulated server and load that replay that window, sets the per-step overhead so that
the replay's decode step matches the measured one, and runs the changed server through
the same measuring core. Apart from reading the recording: no clock, no network.
"""
