//! The contract crate's own test environment (tests only).

use crate::{Dim, Environment, Episode, Rng, Split, StepResult};

/// `k` doors, one sign each, answered `L` below 5 and `R` otherwise; solved when every
/// answer is right. `wrong_r` is a planted oracle bug: every `R` labelled wrong.
pub(crate) struct Doors {
    /// The planted bug.
    pub(crate) wrong_r: bool,
}
pub(crate) struct DoorsEpisode {
    signs: Vec<u8>,
    answers: Vec<bool>,
    wrong_r: bool,
}
impl Episode for DoorsEpisode {
    fn prompt(&self) -> String {
        format!("{}\n", self.signs[0])
    }
    fn step(&mut self, action: &str) -> StepResult {
        let Some(&sign) = self.signs.get(self.answers.len()) else {
            return StepResult::ended();
        };
        let right = action == if sign < 5 { "L" } else { "R" };
        self.answers.push(right);
        let next = self.signs.get(self.answers.len()).map(|s| format!("{s}\n"));
        let label = right && !(self.wrong_r && action == "R");
        StepResult::taken(
            next.clone().unwrap_or_default(),
            next.is_none(),
            label,
            vec![0],
            vec![0],
        )
    }
    fn done(&self) -> bool {
        self.answers.len() == self.signs.len()
    }
    fn outcome(&self) -> bool {
        self.done() && self.answers.iter().all(|&a| a)
    }
}
impl Doors {
    fn episode(&self, split: Split, seed: u64) -> DoorsEpisode {
        let mut rng = Rng::derive(seed, &format!("{split:?}"));
        DoorsEpisode {
            signs: (0..6).map(|_| rng.below(10) as u8).collect(),
            answers: Vec::new(),
            wrong_r: self.wrong_r,
        }
    }
}
impl Environment for Doors {
    fn difficulty_space(&self) -> Vec<Dim> {
        vec![Dim::new("doors", 6.0, 6.0)]
    }
    fn sample(&self, _d: &[f64], split: Split, seed: u64) -> Box<dyn Episode> {
        Box::new(self.episode(split, seed))
    }
    fn demonstration(&self, _d: &[f64], noise: f64, seed: u64) -> (String, Vec<String>) {
        let ep = self.episode(Split::Train, seed);
        let mut slips = Rng::derive(seed, "slips");
        let actions = ep
            .signs
            .iter()
            .map(|&s| {
                let right = s < 5;
                let slip = slips.uniform() < noise;
                if right != slip { "L" } else { "R" }.to_string()
            })
            .collect();
        (ep.prompt(), actions)
    }
}
