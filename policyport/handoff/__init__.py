"""Hand-off: a policy packed into a folder that runs with numpy alone (:mod:`.pack`, and the
folder's own command line, :mod:`.folder_run`) and a single numpy module (:mod:`.export_numpy`)."""
