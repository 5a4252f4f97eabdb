"""What a request must pass before it is answered: the Host names served (``hosts``), body caps
(``limits``), who may call the admin endpoints (``access``), files confined to the data directory
(``paths``), and the parts disabled after a fault while serving (``faults``)."""
