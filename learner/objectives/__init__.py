"""learner/objectives"""
